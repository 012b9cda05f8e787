"""Run logging: console lines, the run's `metrics.jsonl`, optional Weights & Biases, progress bars.

`MetricsLogger(run_dir, cfg)` writes one JSON object per `log(metrics, step)` call to
`<run_dir>/metrics.jsonl` (every line has `"step"`; docs/run_directory.md lists the keys), prints a
short console summary, and mirrors to wandb when `trainer.logger` lists it, by wandb's own conventions
(`wandb_env`): `WANDB_MODE` as the user set it, online for a logged-in user (`WANDB_API_KEY` or
`wandb login`), offline otherwise (a run never needs the network); a resumed run logs into the same wandb run
(its id is kept in the run directory). On resume, lines of steps after the checkpoint (written by the
interrupted run) are dropped first, so the file holds each step once.
"""

from __future__ import annotations

import json
import logging
import math
import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from seal.run_dir import METRICS_FILE

log = logging.getLogger("seal")

# Keys shown on the console line of a step (all keys go to the JSONL file).
CONSOLE_KEYS = (
    "val/accuracy/average",
    "train/reward_mean",
    "train/accuracy_mean",
    "train/excluded",
    "apatch/mean_scale",
    "interface/version",
    "interface/num_cues",
    "actor/pg_loss",
    "actor/kl_loss",
    "actor/grad_norm",
    "timing/step",
)


def setup_console_logging(level: str | int = "INFO") -> None:
    """Plain `time level name: message` lines on stderr (idempotent), every line and everything printed
    scrubbed of secrets (`seal.redact.guard_output`)."""
    from seal.redact import guard_output

    root = logging.getLogger()
    if not any(getattr(h, "_seal", False) for h in root.handlers):
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s", "%H:%M:%S"))
        handler._seal = True  # type: ignore[attr-defined]
        root.addHandler(handler)
    guard_output()
    root.setLevel(level if isinstance(level, int) else level.upper())
    for noisy in ("httpx", "httpcore", "urllib3"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


def plain_number(value: Any) -> Any:
    """A JSON-safe scalar: Python float/int/bool/str; numpy/torch scalars unwrapped; NaN/inf -> None."""
    if hasattr(value, "item") and callable(value.item):
        try:
            value = value.item()
        except (ValueError, RuntimeError):
            return str(value)
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return value
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    return str(value)


def read_metrics(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """All lines of a metrics JSONL file. A damaged line (a run killed mid-write) is skipped with a warning
    naming the file and line, so that it never blocks a resume."""
    path = Path(path)
    if not path.is_file():
        return []
    rows = []
    with open(path, encoding="utf-8", errors="replace") as fh:
        for number, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                row = None
            if not isinstance(row, dict) or not isinstance(row.get("step", 0), int):
                logging.getLogger(__name__).warning("%s:%d: damaged metrics line skipped", path, number)
                continue
            rows.append(row)
    return rows


def metrics_row(metrics: Mapping[str, Any], step: int) -> dict[str, Any]:
    """One ``metrics.jsonl`` line: ``{"step": step, key: plain_number(value), ...}`` (keys sorted).

    Non-finite numbers become null (a NaN loss stays visible); values that are not scalars (dicts, lists,
    multi-element tensors) are left out."""
    row: dict[str, Any] = {"step": int(step)}
    for key, value in sorted(metrics.items(), key=lambda kv: str(kv[0])):
        plain = plain_number(value)
        if isinstance(plain, str) and not isinstance(value, str):
            continue
        row[str(key)] = plain
    return row


def append_metrics(path: Path, row: Mapping[str, Any]) -> None:
    with open(path, "a", encoding="utf-8") as fh:
        fh.write(json.dumps(row) + "\n")


def trim_metrics(path: Path, keep_through: int | None) -> None:
    """Keep the lines with ``step <= keep_through`` (a resumed run rewrites what follows); None empties the
    file (a fresh run)."""
    kept = [] if keep_through is None else [r for r in read_metrics(path) if int(r.get("step", 0)) <= keep_through]
    path.write_text("".join(json.dumps(r) + "\n" for r in kept), encoding="utf-8")


def wandb_logged_in() -> bool:
    """Whether wandb has credentials: `WANDB_API_KEY`, or the netrc entry `wandb login` writes for the host."""
    if os.environ.get("WANDB_API_KEY"):
        return True
    import netrc
    from urllib.parse import urlparse

    host = urlparse(os.environ.get("WANDB_BASE_URL") or "https://api.wandb.ai").hostname or "api.wandb.ai"
    try:
        return netrc.netrc(os.environ.get("NETRC")).authenticators(host) is not None
    except (OSError, netrc.NetrcParseError):
        return False


def wandb_env(run_dir: str | os.PathLike[str], resume: bool) -> dict[str, str]:
    """The wandb environment of a run (both engines; verl's own wandb reads it in its workers).

    `WANDB_MODE` is left as the user set it (`disabled`, `offline`, `online`); without it a user who is not
    logged in gets `offline`. `WANDB_RUN_ID` is the run's id, kept in the run directory, and `WANDB_RESUME`
    `allow`, so a resumed run continues its wandb run; a fresh run gets a new id."""
    from seal.run_dir import RunDir

    env: dict[str, str] = {}
    if not os.environ.get("WANDB_MODE") and not wandb_logged_in():
        env["WANDB_MODE"] = "offline"
    id_file = RunDir(run_dir).wandb_run_id_file
    run_id = id_file.read_text(encoding="utf-8").strip() if resume and id_file.is_file() else ""
    if not run_id:
        import secrets

        run_id = secrets.token_hex(4)  # wandb's ids are short lowercase alphanumerics
        id_file.parent.mkdir(parents=True, exist_ok=True)
        id_file.write_text(run_id + "\n", encoding="utf-8")
    env.update(WANDB_RUN_ID=run_id, WANDB_RESUME="allow")
    return env


class MetricsLogger:
    """Console + `metrics.jsonl` + optional wandb for one run.

    Args:
        run_dir: the run directory (`metrics.jsonl` goes there).
        loggers: `trainer.logger` (`console`, `jsonl`, `wandb`).
        resume_step: when resuming from a checkpoint at this step, drop file lines with a larger step;
            None = a fresh run (an existing file is replaced).
        wandb_project / experiment_name / config: for wandb.
    """

    def __init__(
        self,
        run_dir: str | os.PathLike[str],
        loggers: list[str] | tuple[str, ...] = ("console", "jsonl"),
        resume_step: int | None = None,
        wandb_project: str = "seal",
        experiment_name: str = "run",
        config: Mapping[str, Any] | None = None,
    ) -> None:
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.loggers = tuple(loggers)
        self.path = self.run_dir / METRICS_FILE
        self._wandb = None
        if "jsonl" in self.loggers:
            trim_metrics(self.path, resume_step)
        if "wandb" in self.loggers:
            self._wandb = self._start_wandb(wandb_project, experiment_name, config, resume_step is not None)

    def _start_wandb(self, project: str, name: str, config: Mapping[str, Any] | None, resume: bool) -> Any:
        try:
            import wandb
        except ImportError:
            log.warning("trainer.logger lists wandb but the wandb package is not installed; skipping it")
            return None
        env = wandb_env(self.run_dir, resume)
        mode = os.environ.get("WANDB_MODE") or env.get("WANDB_MODE")  # None: wandb decides (logged in: online)
        return wandb.init(project=project, name=name, dir=str(self.run_dir), config=dict(config or {}),
                          mode=mode, resume="allow", id=env["WANDB_RUN_ID"])

    def log(self, metrics: Mapping[str, Any], step: int) -> None:
        row = metrics_row(metrics, step)
        if "jsonl" in self.loggers:
            append_metrics(self.path, row)
        if "console" in self.loggers:
            shown = [f"{k}={row[k]:.4g}" for k in CONSOLE_KEYS if isinstance(row.get(k), (int, float))]
            log.info("step %d: %s", step, " ".join(shown) if shown else f"{len(row) - 1} metrics")
        if self._wandb is not None:
            self._wandb.log({k: v for k, v in row.items() if k != "step" and v is not None}, step=int(step))

    def close(self) -> None:
        if self._wandb is not None:
            self._wandb.finish()
            self._wandb = None


def progress(total: int, desc: str, leave: bool = False, position: int | None = None):
    """A tqdm progress bar on stderr (quiet when SEAL_NO_PROGRESS is set, e.g. in CI logs)."""
    from tqdm.auto import tqdm

    return tqdm(total=total, desc=desc, leave=leave, position=position, dynamic_ncols=True,
                disable=bool(os.environ.get("SEAL_NO_PROGRESS")), mininterval=1.0, file=sys.stderr)

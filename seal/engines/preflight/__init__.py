"""The pre-flight check: does this node hold what the run needs, before anything starts (docs/verl_engine.md,
"The pre-flight check"; the node contract in docs/reproduce.md).

    seal-train --conf exp/SEAL.yaml --preflight      # the table; exit status 1 on any FAIL; starts and writes nothing

It also runs by itself at the start of every verl run (`seal.engines.verl.launch.train`, before Ray starts): a FAIL
stops the run with the table, and the one change it may make (fewer TransferQueue storage units when Ray has too
few logical CPUs for them) is logged and applied to the run's verl config.

Every requirement is computed from the resolved recipe and verl config (`plan`); every fact about the node comes
from one small probe function (`probes`), which the tests replace. One row per check (`checks`): the check, what
is needed, what was found, OK / WARN / FAIL / n/a, and the knob or action that fixes it.
"""

from __future__ import annotations

import logging
import textwrap
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from seal.engines.preflight import checks as K
from seal.engines.preflight import plan as P
from seal.engines.preflight import probes

log = logging.getLogger(__name__)

__all__ = ["PreflightFailed", "Report", "local_report", "preflight", "probes", "verl_report"]

ASSUMED_CARD_BYTES = 80 * 10**9  # no GPU visible: the plan is shown for the 80 GB card the recipes target


class PreflightFailed(RuntimeError):
    """A FAIL row: the run would stop or hang for a reason the table names. The message names the failed checks in
    one line; `table` is the whole table (the launcher prints it below its one-line error)."""

    def __init__(self, message: str, table: str):
        super().__init__(message)
        self.table = table


@dataclass
class Report:
    title: str
    rows: list[K.Row]
    notes: list[str] = field(default_factory=list)
    adjustments: dict[str, Any] = field(default_factory=dict)  # verl keys the run changes to fit the node

    @property
    def failed(self) -> list[K.Row]:
        return [r for r in self.rows if r.verdict == K.FAIL]

    def table(self) -> str:
        """The rows as a text table; each fix on the line below its row."""
        widths = (28, 5, 58, 42)
        head = ("check", "", "needed", "found")
        lines = [self.title, "  ".join(h.ljust(w) for h, w in zip(head, widths, strict=True)).rstrip(), "-" * 137]
        for row in self.rows:
            cells = [textwrap.wrap(text, w) or [""] for text, w in
                     zip((row.check, row.verdict, row.needed, row.found), widths, strict=True)]
            for i in range(max(map(len, cells))):
                lines.append("  ".join((c[i] if i < len(c) else "").ljust(w)
                                       for c, w in zip(cells, widths, strict=True)).rstrip())
            if row.fix:
                lines += textwrap.wrap(f"fix: {row.fix}", 137, initial_indent=" " * 6, subsequent_indent=" " * 11)
        lines += [f"note: {n}" for n in self.notes]
        failed = ", ".join(r.check for r in self.failed)
        lines.append(f"pre-flight: FAIL ({failed})" if failed else "pre-flight: pass")
        return "\n".join(lines)


def _shape(config: dict[str, Any] | None, origin: str, notes: list[str]) -> P.ModelShape | None:
    if config is None:
        return None
    shape = P.model_shape(config)
    notes.append(f"model: {shape.params / 1e9:.3f} B parameters, from {origin}")
    return shape


def _total_steps(cfg: Any) -> int:
    from seal import recipe as C
    from seal.engines.data import load_tasks
    from seal.io_utils import input_path

    d = cfg.data
    return C.total_training_steps(cfg, len(load_tasks(str(input_path(d.train_files)), d.max_train_tasks,
                                                      d.train_task_ids)))


def _unsized(check: str, path: str) -> K.Row:
    return K.Row(check, "the model's size", f"no config.json for {path}", K.FAIL,
                 "make the model available offline (see the model row): its size decides this check")


def verl_report(cfg: Any, verl_cfg: Any, run_dir: str | Path) -> Report:
    """Every check of a verl run, from its resolved verl config (`to_verl_config`)."""
    gpu = cfg.trainer.device == "cuda"
    notes: list[str] = []
    rows: list[K.Row] = []
    n_gpus = int(P.sel(verl_cfg, "trainer.n_gpus_per_node"))
    world = n_gpus * int(P.sel(verl_cfg, "trainer.nnodes"))
    if gpu:
        rows += K.gpu_rows(n_gpus)
        rows.append(K.driver_row())
        if cfg.trainer.nnodes > 1:
            notes.append("several nodes: this node's GPUs, CPUs, disk and memory only; run --preflight on each node")
    else:
        why = "trainer.device cpu: no GPU used"
        rows += [K.Row("GPUs", "none", why, K.SKIP), K.Row("driver", "none", why, K.SKIP)]
    cpu, adjustments = K.cpu_row(verl_cfg)
    rows.append(cpu)
    model, config, origin = K.model_row(cfg)
    rows.append(model)
    shape = _shape(config, origin, notes)
    param_bytes = P.dtype_bytes(str(P.sel(verl_cfg, "actor_rollout_ref.actor.fsdp_config.model_dtype", "fp32")))
    if shape is None:
        rows += [_unsized("disk", cfg.model.path), _unsized("host memory", cfg.model.path)]
    else:
        save = P.save_plan(shape.params, param_bytes, _total_steps(cfg), cfg.trainer.save_freq,
                           cfg.trainer.keep_full_checkpoints)
        rows.append(K.disk_row(save, run_dir, "trainer.keep_full_checkpoints"))
        rows.append(K.write_speed_row(save.hf_export, run_dir,
                                      float(P.sel(verl_cfg, "actor_rollout_ref.nccl_timeout"))))
        exact, approx = P.host_memory_plan(verl_cfg, shape, world, n_gpus)
        rows.append(K.host_memory_row(exact, approx))
    bucket = int(P.sel(verl_cfg, "actor_rollout_ref.rollout.checkpoint_engine.update_weights_bucket_megabytes"))
    rows.append(K.shm_row(K.SHM_MIN_GPU_BYTES if gpu else bucket << 20, gpu))
    if gpu and shape is not None:
        cards = probes.gpu_memory()
        card = min(total for total, _used in cards) if cards else ASSUMED_CARD_BYTES
        if not cards:
            notes.append(f"no GPU visible: the memory plan is shown for an {K.gb(card)} card (the recipes' target)")
        rows += K.memory_rows(P.memory_plan(verl_cfg, shape, card, world), card)
        notes.append(f"memory plan band: the estimated parts (~) may be off by {P.APPROX_BAND:.0%} either way, plus "
                     f"{P.FRAGMENTATION:.0%} of the card for the allocator; FAIL = over the card even at the low end")
    elif not gpu:
        rows.append(K.Row("GPU memory plan", "none", "trainer.device cpu: no GPU used", K.SKIP))
    title = f"pre-flight: engine verl, trainer.device {cfg.trainer.device}, {world} GPU(s), model {cfg.model.path}"
    return Report(title, rows, notes, adjustments)


def local_report(cfg: Any, run_dir: str | Path) -> Report:
    """The checks that apply to the local engine (one process, no Ray, no vLLM server): the model, the disk its
    saves need (every save kept: the model and its AdamW state in float32), host memory."""
    notes = ["engine local: checks model, disk, host memory; not GPUs/driver/CPUs (Ray)//dev/shm/GPU memory plan/"
             "write speed, which are the verl engine's (one process, no Ray, no NCCL barrier)"]
    rows: list[K.Row] = []
    model, config, origin = K.model_row(cfg)
    rows.append(model)
    shape = _shape(config, origin, notes)
    if shape is None:
        rows += [_unsized("disk", cfg.model.path), _unsized("host memory", cfg.model.path)]
    else:
        steps = _total_steps(cfg)
        saves = len(P.saved_steps(steps, cfg.trainer.save_freq))
        save = P.SavePlan(full_save=shape.params * 4 * (1 + P.ADAM_STATES), hf_export=shape.params * 4,
                          total_saves=saves, full_kept=saves, transcripts=P.transcript_bytes(steps), steps=steps)
        rows.append(K.disk_row(save, run_dir, None))
        exact = {"policy + reference + gradients + AdamW (fp32)": shape.params * 4 * 5}
        rows.append(K.host_memory_row(exact, {"the process (~)": P.PROCESS_RSS_BYTES}))
    return Report(f"pre-flight: engine local, model {cfg.model.path}", rows, notes)


def preflight(cfg: Any, verl_overrides: Sequence[str] = ()) -> Report:
    """`--preflight`: the report of a recipe as the launcher resolved it; starts nothing, writes nothing (the
    write-speed probe's temporary file excepted, deleted at once)."""
    from seal.recipe import run_dir

    run = Path(run_dir(cfg)).absolute()
    if cfg.engine != "verl":
        return local_report(cfg, run)
    from seal.engines.verl.config import to_verl_config

    return verl_report(cfg, to_verl_config(cfg, run, verl_overrides), run)


def enforce(report: Report, verl_cfg: Any) -> None:
    """At the start of a verl run: log the table, stop on a FAIL (`PreflightFailed`, the table as its message),
    apply the report's adjustments to `verl_cfg`."""
    from omegaconf import OmegaConf, open_dict

    if report.failed:
        raise PreflightFailed(f"the pre-flight check failed: {', '.join(r.check for r in report.failed)} (the table "
                              "below; python launcher.py --conf <recipe> --preflight shows it again)", report.table())
    log.info("%s", report.table())
    with open_dict(verl_cfg):
        for key, value in report.adjustments.items():
            log.warning("pre-flight: %s %s -> %s (to fit Ray's logical CPUs)", key, OmegaConf.select(verl_cfg, key),
                        value)
            OmegaConf.update(verl_cfg, key, value, merge=False)

"""The run directory `runs/<experiment_name>/`: its layout and the best-checkpoint rule, in one place.

Both engines write it, the launcher creates it, `python -m seal.evaluate --run` reads it and the
report scripts read its `metrics.jsonl` and `eval/`; docs/run_directory.md describes the contract.
Every name and format here is what existing runs hold, so old runs still resume and evaluate::

    config.yaml                         the resolved recipe (launcher)
    env_service.log                     the env service the launcher started
    metrics.jsonl                       one JSON object per line, each with an int "step"
    wandb_run_id                        the wandb run id, so a resumed run logs into the same wandb run
    validation/step_<N>.jsonl           per-episode validation records (both; verl: with token ids)
    transcripts/step_<N>.jsonl          a sample of step N's training episodes (`transcript_entry`; both engines)
    advantages.jsonl                    per step, every row's GRPO and used advantage (verl engine;
                                        seal.engines.advantage_record)
    verl_config.yaml, data/<split>_subset.parquet          (verl engine)
    checkpoints/step_<N>/               local: HF model + tokenizer, seal_state.json, trainer_state.pt
    checkpoints/global_step_<N>/        verl: actor/ (shards, optimizer, actor/huggingface), seal_state.json;
                                        checkpoints/step_<N> is a symlink to it
    checkpoints/latest.json             {"step": N, "path": "checkpoints/step_N"}
    checkpoints/best.json               {"step": N, "path": ..., "metric": ..., "value": float}
    eval/last, eval/best                evaluation directories of those two checkpoints

The best-checkpoint rule: a validation value is a new best only when it is strictly higher than the
best so far, so the earliest step wins a tie (the release's rule). Training ranks on
`trainer.best_metric`; evaluation ranks on `BEST_METRIC` (the overall average) and re-selects from
`metrics.jsonl` when a `best.json` names another metric.

This module is deliberately light (no torch, no recipe): the launcher and the report scripts import it.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from seal.io_utils import write_json_atomic

if TYPE_CHECKING:
    from seal.core.record import EpisodeRecord

log = logging.getLogger(__name__)

CONFIG_FILE = "config.yaml"
METRICS_FILE = "metrics.jsonl"
WANDB_RUN_ID_FILE = "wandb_run_id"
ENV_SERVICE_LOG = "env_service.log"
VERL_CONFIG_FILE = "verl_config.yaml"
VALIDATION_DIR = "validation"
TRANSCRIPTS_DIR = "transcripts"
DATA_DIR = "data"
EVAL_DIR = "eval"
CHECKPOINTS_DIR = "checkpoints"
LATEST_FILE = "latest.json"
BEST_FILE = "best.json"
STEP_PREFIX = "step_"
VERL_STEP_PREFIX = "global_step_"  # verl names its checkpoint folders so and parses the step from the name
# Written by SealController.save (seal.core.controller.STATE_FILE; seal.core may not import this module,
# tests/test_run_dir.py keeps the two equal).
SEAL_STATE_FILE = "seal_state.json"
TRAINER_STATE_FILE = "trainer_state.pt"  # local engine: optimizer, step, best record, RNG states

BEST_METRIC = "val/accuracy/average"  # the overall average: mean of the four category accuracies


# --------------------------------------------------------------------------- the best-checkpoint rule
def improves(value: float | None, best_value: float | None) -> bool:
    """Whether a validation `value` is a new best over `best_value` (None = no best yet).

    Strictly higher only: on a tie the earlier checkpoint stays best. A missing value never improves.
    """
    if value is None:
        return False
    return best_value is None or float(value) > float(best_value)


def best_record(step: int, path: str, metric: str, value: float) -> dict[str, Any]:
    """The `best.json` object."""
    return {"step": int(step), "path": str(path), "metric": str(metric), "value": float(value)}


# --------------------------------------------------------------------------- layout
class Checkpoints:
    """`<run>/checkpoints/`: step folders and the latest / best pointers.

    The verl engine passes verl's `trainer.default_local_dir` here (normally `<run>/checkpoints`).
    The `path` entries of the pointers are relative to the run directory (`checkpoints/step_N`).
    """

    def __init__(self, root: str | os.PathLike[str]):
        self.root = Path(root)

    @staticmethod
    def ref(step: int) -> str:
        """How the pointers name a step's checkpoint: `checkpoints/step_N` (relative to the run)."""
        return f"{CHECKPOINTS_DIR}/{STEP_PREFIX}{int(step)}"

    def step_dir(self, step: int) -> Path:
        return self.root / f"{STEP_PREFIX}{int(step)}"

    def staging_dir(self, step: int) -> Path:
        """Where a step's checkpoint is assembled before it is renamed into place (local engine)."""
        return self.root / f".{STEP_PREFIX}{int(step)}.tmp"

    def verl_step_dir(self, step: int) -> Path:
        return self.root / f"{VERL_STEP_PREFIX}{int(step)}"

    def link_verl_step(self, step: int) -> Path:
        """`step_N` -> `global_step_N` (relative symlink), replacing an older link or file."""
        link = self.step_dir(step)
        if link.is_symlink() or link.exists():
            link.unlink()
        link.symlink_to(self.verl_step_dir(step).name, target_is_directory=True)
        return link

    @property
    def latest_file(self) -> Path:
        return self.root / LATEST_FILE

    @property
    def best_file(self) -> Path:
        return self.root / BEST_FILE

    def write_latest(self, step: int) -> None:
        write_json_atomic(self.latest_file, {"step": int(step), "path": self.ref(step)})

    def write_best(self, record: Mapping[str, Any]) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        write_json_atomic(self.best_file, dict(record))

    def read_best(self) -> dict[str, Any] | None:
        """`best.json` as written (None without one)."""
        if not self.best_file.is_file():
            return None
        return json.loads(self.best_file.read_text(encoding="utf-8"))

    def saved_steps(self) -> dict[int, Path]:
        """`step -> checkpoints/step_N` for every step folder (or verl link) present."""
        out: dict[int, Path] = {}
        for path in self.root.glob(f"{STEP_PREFIX}*"):
            number = path.name[len(STEP_PREFIX):]
            if path.is_dir() and number.isdigit():
                out[int(number)] = path
        return out


class RunDir:
    """Paths of one run directory (nothing is created until an engine or the launcher writes)."""

    def __init__(self, root: str | os.PathLike[str]):
        self.root = Path(root)

    @classmethod
    def of(cls, run_root: str | os.PathLike[str], experiment_name: str,
           base: str | os.PathLike[str] | None = None) -> RunDir:
        """`<run_root>/<experiment_name>`; a relative `run_root` is taken from `base` (default: the cwd)."""
        root = Path(run_root)
        if not root.is_absolute() and base is not None:
            root = Path(base) / root
        return cls(root / str(experiment_name))

    def __fspath__(self) -> str:
        return str(self.root)

    def __repr__(self) -> str:
        return f"RunDir({str(self.root)!r})"

    @property
    def config_file(self) -> Path:
        return self.root / CONFIG_FILE

    @property
    def metrics_file(self) -> Path:
        return self.root / METRICS_FILE

    @property
    def wandb_run_id_file(self) -> Path:
        return self.root / WANDB_RUN_ID_FILE

    @property
    def env_service_log(self) -> Path:
        return self.root / ENV_SERVICE_LOG

    @property
    def verl_config_file(self) -> Path:
        return self.root / VERL_CONFIG_FILE

    @property
    def checkpoints(self) -> Checkpoints:
        return Checkpoints(self.root / CHECKPOINTS_DIR)

    def validation_file(self, step: int) -> Path:
        return self.root / VALIDATION_DIR / f"{STEP_PREFIX}{int(step)}.jsonl"

    def transcripts_file(self, step: int) -> Path:
        """A bounded sample of step `step`'s training transcripts (`write_transcripts`; both engines)."""
        return self.root / TRANSCRIPTS_DIR / f"{STEP_PREFIX}{int(step)}.jsonl"

    def subset_file(self, split: str) -> Path:
        """Where the verl engine writes the task subset of a split (`train` or `val`, `seal.engines.data`)."""
        return self.root / DATA_DIR / f"{split}_subset.parquet"

    def eval_dir(self, name: str) -> Path:
        """`eval/<name>` (`last` and `best` for `seal.evaluate --run`)."""
        return self.root / EVAL_DIR / name

    def latest_checkpoint(self) -> Path | None:
        """The checkpoint a run resumes from (``trainer.resume: auto``), never silently none.

        ``checkpoints/latest.json`` names it. A pointer that cannot be read fails with a message naming the
        file; a pointer to a missing folder resumes from the newest complete checkpoint (one with
        ``seal_state.json``), saying so, and fails naming the file if there is none — a fresh start would
        overwrite the earlier run's checkpoints and metrics. Without a pointer, checkpoints present are
        resumed the same way (newest complete one); None only for a run directory without checkpoints."""
        pointer = self.checkpoints.latest_file
        complete = {
            step: path for step, path in self.checkpoints.saved_steps().items() if (path / SEAL_STATE_FILE).is_file()
        }
        newest = complete[max(complete)] if complete else None
        if not pointer.is_file():
            if newest is not None:
                log.warning("%s is missing; resuming from the newest complete checkpoint %s", pointer, newest)
            return newest
        entry = _read_pointer(pointer)
        if not isinstance(entry.get("path"), str):
            raise ValueError(f"{pointer}: expected a string 'path'")
        path = self.root / entry["path"]
        if path.is_dir():
            return path
        if newest is not None:
            log.warning("%s names %s, which is missing; resuming from the newest complete "
                        "checkpoint %s", pointer, path, newest)
            return newest
        raise FileNotFoundError(
            f"{pointer} names {path}, which is missing, and no other checkpoint is complete. "
            "Restore it, or set trainer.resume=disable to start afresh (this replaces the run's metrics)."
        )


# --------------------------------------------------------------------------- checkpoint selection
@dataclass(frozen=True)
class CheckpointChoice:
    name: str  # "last" | "best"
    step: int
    path: Path  # the checkpoint directory
    selection: str  # how it was chosen (recorded in the summary's notes)


def _read_pointer(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise ValueError(f"{path}: cannot read ({exc})") from None
    if not isinstance(data, dict) or not isinstance(data.get("step"), int):
        raise ValueError(f"{path}: expected an object with an integer 'step'")
    return data


def validation_averages(metrics_path: Path) -> dict[int, float]:
    """``step -> val/accuracy/average`` from a run's metrics.jsonl (later lines for a step win)."""
    out: dict[int, float] = {}
    if not metrics_path.is_file():
        return out
    for number, line in enumerate(metrics_path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            raise ValueError(f"{metrics_path}:{number}: not JSON") from None
        if isinstance(row, dict) and isinstance(row.get("step"), int) and BEST_METRIC in row:
            out[row["step"]] = float(row[BEST_METRIC])
    return out


def best_step(averages: dict[int, float], available: set[int]) -> int | None:
    """The checkpointed step with the highest overall validation average (earliest on ties: `improves`)."""
    best: int | None = None
    for step in sorted(averages):
        if step in available and improves(averages[step], None if best is None else averages[best]):
            best = step
    return best


def select_checkpoints(run_dir: str | os.PathLike[str]) -> list[CheckpointChoice]:
    """The run's last and best checkpoints (docs/run_directory.md), best on ``val/accuracy/average``."""
    run = RunDir(run_dir)
    ckpts = run.checkpoints
    if not ckpts.root.is_dir():
        raise ValueError(f"{run.root}: no {CHECKPOINTS_DIR}/ folder (not a run directory?)")
    available = ckpts.saved_steps()
    choices: list[CheckpointChoice] = []
    if ckpts.latest_file.is_file():
        latest = _read_pointer(ckpts.latest_file)
        path = run.root / latest.get("path", ckpts.ref(latest["step"]))
        choices.append(CheckpointChoice("last", latest["step"], path, f"{CHECKPOINTS_DIR}/{LATEST_FILE}"))
    elif available:
        step = max(available)
        choices.append(CheckpointChoice("last", step, available[step], "highest step_N folder (no latest.json)"))
    else:
        raise ValueError(f"{ckpts.root}: no {LATEST_FILE} and no step_N checkpoints")

    averages = validation_averages(run.metrics_file)
    best = _read_pointer(ckpts.best_file) if ckpts.best_file.is_file() else None
    if best is not None and best.get("metric") == BEST_METRIC:
        path = run.root / best.get("path", ckpts.ref(best["step"]))
        choices.append(CheckpointChoice("best", best["step"], path,
                                        f"{CHECKPOINTS_DIR}/{BEST_FILE} ({BEST_METRIC} = {best.get('value')})"))
    else:
        step = best_step(averages, set(available))
        why = ("best.json selects on " + repr(best.get("metric")) if best is not None else "no best.json")
        if step is not None:
            choices.append(CheckpointChoice("best", step, available[step],
                                            f"re-selected on {BEST_METRIC} = {averages[step]} from {METRICS_FILE} "
                                            f"({why})"))
        else:
            log.warning("%s: %s and no validation average for a saved checkpoint; evaluating last only",
                        run.root, why)
    return choices


def hf_weights_dir(checkpoint: str | os.PathLike[str]) -> Path | None:
    """The Hugging Face model folder inside a checkpoint, or None.

    Local engine: the checkpoint folder itself; verl: `actor/huggingface` (verl's `hf_model` save
    content) or `huggingface` (where `verl.model_merger` is told to merge the shards).
    """
    checkpoint = Path(checkpoint)
    for candidate in (checkpoint, checkpoint / "huggingface", checkpoint / "actor" / "huggingface"):
        if (candidate / "config.json").is_file() and (
            any(candidate.glob("*.safetensors")) or any(candidate.glob("*.bin"))
        ):
            return candidate
    return None


# --------------------------------------------------------------------------- training transcripts
TRANSCRIPTS_PER_STEP = 4  # training transcripts kept per step: the first rollout of each of the first 4 tasks
TRANSCRIPT_TEXT_CHARS = 4000  # each text of the sample is cut to this many characters


def transcript_sample(task_ids: list[str | None]) -> list[int]:
    """Indices of the rows whose transcripts a step keeps: the first row of each of the first
    `TRANSCRIPTS_PER_STEP` tasks (None: a row that is no episode, e.g. verl's padding)."""
    seen: set[str] = set()
    kept: list[int] = []
    for i, task_id in enumerate(task_ids):
        if task_id is not None and task_id not in seen and len(kept) < TRANSCRIPTS_PER_STEP:
            seen.add(task_id)
            kept.append(i)
    return kept


def cut_text(text: str, keep_end: bool = False) -> str:
    """`text` cut to `TRANSCRIPT_TEXT_CHARS` characters, keeping its start (or its end), saying how much went."""
    extra = len(text) - TRANSCRIPT_TEXT_CHARS
    if extra <= 0:
        return text
    note = f"[... {extra} characters cut]"
    return f"{note} {text[-TRANSCRIPT_TEXT_CHARS:]}" if keep_end else f"{text[:TRANSCRIPT_TEXT_CHARS]} {note}"


# One line of `transcripts/step_<N>.jsonl`, the same in both engines (docs/run_directory.md): the episode's record
# and its token sequences decoded as the model saw them.
TRANSCRIPT_FIELDS = ("task_id", "category", "reward", "accuracy", "failure_tags", "excluded", "exclude_reason",
                     "prompt", "response")


def transcript_entry(record: EpisodeRecord, tokenizer: Any, prompt_ids: Sequence[int],
                     response_ids: Sequence[int]) -> dict[str, Any]:
    """The transcript line of one episode (`TRANSCRIPT_FIELDS`): its record's fields, and its prompt and response
    token ids decoded with the policy's tokenizer, chat template and special tokens included, so the text is
    what the model read and wrote: the prompt's end (its start is the tool documentation) and the response's
    start (the model's turns and the observations between them), each cut by `cut_text`."""
    fields = record.to_dict()  # the record's one wire form; the line keeps TRANSCRIPT_FIELDS' order
    return {**{name: fields[name] for name in TRANSCRIPT_FIELDS if name in fields},
            "prompt": cut_text(tokenizer.decode(list(prompt_ids)), keep_end=True),
            "response": cut_text(tokenizer.decode(list(response_ids)))}


def validation_entry(record: EpisodeRecord, **extras: Any) -> dict[str, Any]:
    """One line of `validation/step_<N>.jsonl`, the same in both engines: the episode's record
    (`EpisodeRecord.to_dict()`), then what the engine adds (the local engine the episode's `num_model_calls`, the
    verl engine its token ids as sampled)."""
    return record.to_dict() | extras


@contextlib.contextmanager
def transcript_failures_logged(step: int | str) -> Iterator[None]:
    """The one rule for a failed transcript write, in both engines: a warning naming the step and the error, and
    the step goes on.

    Why not fail the step: a transcript is for a person to read. No number of the run is computed from it (the
    metrics, `advantages.jsonl` and the validation lines are, and their failed writes stop the run), so going on
    never leaves a wrong number, and stopping would lose the step's training, which a run must keep. Why not
    silently: the warning says the file is missing and why, so a missing file is never a mystery."""
    try:
        yield
    except Exception as exc:  # noqa: BLE001 - any failure of a diagnostic (decoding, I/O, schema): the rule above
        log.warning("step %s: training transcripts not written (a diagnostic: the step goes on): %r", step, exc)


def write_transcripts(path: Path, entries: list[dict[str, Any]]) -> None:
    """One JSON line per kept episode (`transcript_sample`), each a `transcript_entry`: a user can read what
    the model did at every step, in a file bounded whatever the batch size. An entry with other fields is
    refused (ValueError) before anything is written: one schema for both engines."""
    for entry in entries:
        if tuple(entry) != TRANSCRIPT_FIELDS:
            raise ValueError(f"transcript entry fields {tuple(entry)} are not {TRANSCRIPT_FIELDS} "
                             "(build entries with seal.run_dir.transcript_entry)")
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8") as fh:
        for entry in entries:
            fh.write(json.dumps(entry, ensure_ascii=False) + "\n")

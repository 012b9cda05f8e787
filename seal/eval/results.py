"""The evaluation directory: its files, their schema, and the one place that writes and reads them.

``python -m seal.evaluate`` (held-in, ``seal.eval.evaluate``) and the OOD harnesses (``seal.eval.ood``) write
through this module; the report modules (``seal.report.tables``, ``plots``, ``failure_report``) read through
it. The contract is ``docs/run_directory.md``; in short:

``results.jsonl``, one JSON object per task, in task order:

    task_id, category            BFCL id and category (OOD: the sub-benchmark key, e.g. ``memory``)
    accuracy                     0 or 1: the official verdict, 0 whenever ``error`` is set
    progress                     share of scorable turns passed (the service's diagnosis), or null
    failure_tags, paper_labels   per user turn: the release's progress tag and the paper's label
    num_model_calls, num_turns   model calls made; user turns of the task
    stop_reason                  done | context_limit | max_model_calls | excluded | error
    end_reason, turns            the service's end reason and per-turn details (held-in)
    messages                     the transcript: system, user, assistant replies, observations
    error                        null, or why the task could not be played (it then counts as a failure); a task
                                 whose first prompt does not fit the context is an error beginning
                                 ``context window`` (``stop_reason`` context_limit, no model call); a task
                                 whose grading raised inside BFCL's checker is an error naming it
    consistent_with_turns        the service's check that BFCL's verdict agrees with the per-turn tags, or null
    rules                        the rules profile the episode ran under (``official`` | ``release``)

OOD records add ``bfcl_category``, ``scenario``, ``force_quit``, ``final_answer``, ``possible_answers`` and
``verdict`` (built by ``seal.eval.ood.result_record``).

``summary.json``: ``policy``, ``split``, ``rules``, ``status`` (``running`` while the evaluation runs,
``interrupted`` or ``complete``), ``n``, ``accuracy`` and ``stderr`` per category, ``count``,
``tag_counts`` and ``label_counts`` per category, ``checker_errors`` and ``inconsistent_verdicts`` (task ids),
``wall_s``, ``notes``; held-in summaries with all four
BFCL V3 categories add ``average`` (mean of the category means) to ``accuracy`` and ``stderr``; OOD summaries
add ``breakdown`` (per BFCL sub-category); ``--run`` adds ``checkpoint``. Standard errors follow
``seal.eval.stats``. OOD memory runs also write ``prereq_conversations.jsonl``.

While an evaluation runs, each task's record is appended to ``results.jsonl`` as the task finishes
(:class:`ResultsLog`), so an interrupted evaluation keeps every finished task and ``--resume`` plays only the
rest; the finished file is rewritten in task order.

A path given where an evaluation directory is expected may also be a run directory: it resolves to
``eval/last`` (the honest number), else to its only ``eval/<name>``, else to its only ``eval/last_*``
(:func:`resolve_eval_dir`).
"""

from __future__ import annotations

import hashlib
import json
import math
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from types import MappingProxyType
from typing import Any

from env_service.vocab import CATEGORIES, CHECKER_EXCEPTION, category_of
from seal.eval.stats import Estimate, binomial_stderr, mean_estimate
from seal.redact import scrub_data
from seal.rollout.types import Rollout
from seal.run_dir import RunDir

RESULTS_FILE = "results.jsonl"
SUMMARY_FILE = "summary.json"
AVERAGE = "average"
# A held-in summary's accuracy keys, in the order tables print them, and their column headers.
HELD_IN_METRICS: tuple[str, ...] = (AVERAGE, *CATEGORIES)
HELD_IN_HEADERS: Mapping[str, str] = MappingProxyType(
    {
        AVERAGE: "Average",
        "multi_turn_base": "Base",
        "multi_turn_miss_func": "Miss Func",
        "multi_turn_miss_param": "Miss Param",
        "multi_turn_long_context": "Long Context",
    }
)


class EvalDataError(ValueError):
    """An evaluation directory, summary or mapping file that does not follow docs/run_directory.md."""


# Files an evaluation writes into its directory (all it removes with --overwrite; anything else is left alone).
EVAL_FILES = (RESULTS_FILE, SUMMARY_FILE, "prereq_conversations.jsonl")


# --- the output directory ----------------------------------------------------------------------------


def default_eval_name(policy: str, split: str, tasks: Sequence[str] | None = None, rules: str | None = None,
                      benchmark: str | None = None, default_rules: str = "release") -> str:
    """The default evaluation directory name: everything that tells two evaluations apart.

    ``<policy>_<split | one task id | <n>tasks-<hash of the ids>>[_<rules>]`` (rules only when not the default;
    OOD: ``<policy>_<benchmark>[_<subset>]``), so a spot check on a few tasks never lands in the directory
    of a full-split result."""
    name = policy.split("#")[-1].replace("/", "_").replace(":", "_").strip("_") or "run"
    subset = None
    if tasks:
        ids = sorted(set(tasks))
        digest = hashlib.sha1(",".join(ids).encode()).hexdigest()[:8]
        subset = ids[0] if len(ids) == 1 else f"{len(ids)}tasks-{digest}"
    if benchmark:
        return "_".join(p for p in (name, benchmark, subset) if p)
    parts = [name, subset or split]
    if rules and rules != default_rules:
        parts.append(rules)
    return "_".join(parts)


def claim_output_dir(out: Path, *, resume: bool = False, overwrite: bool = False) -> None:
    """Refuse to write into a directory that already holds something unless asked to (`resume` keeps its
    finished tasks, `overwrite` replaces the evaluation's own files): a result is never replaced silently."""
    if resume and overwrite:
        raise ValueError("--resume keeps the finished tasks in --out and --overwrite replaces them; give one")
    if out.exists() and not out.is_dir():
        raise ValueError(f"--out {out} is a file, not a directory")
    held = sorted(p.name for p in out.iterdir()) if out.is_dir() else []
    if not held or resume:
        return
    if not overwrite:
        shown = ", ".join(held[:5]) + (", ..." if len(held) > 5 else "")
        raise ValueError(f"{out} is not empty ({shown}): refusing to overwrite an earlier result. Give --resume "
                         "to finish an interrupted evaluation with the same settings, --overwrite to replace it, "
                         "or another --out")
    for name in EVAL_FILES:
        (out / name).unlink(missing_ok=True)


# --- per-task records ---------------------------------------------------------------------------------


def record_from_rollout(rollout: Rollout, error: str | None = None, rules: str | None = None) -> dict[str, Any]:
    """One ``results.jsonl`` line from a finished episode.

    An excluded episode or one that failed counts as a failure (accuracy 0) with `error` set: every task of
    the split is scored, so infrastructure trouble can never make a policy look better."""
    result = rollout.eval_result or {}
    official = result.get("official") or {}
    if error is None and rollout.excluded:
        detail = next((m["content"] for m in rollout.messages if m.get("role") == "error"), "")
        if official.get("error_type") == CHECKER_EXCEPTION:
            detail = f"{CHECKER_RAISED}: {official.get('error_message')}"
        error = f"excluded ({rollout.exclude_reason}): {detail}".strip()
    if error is None:
        error = first_prompt_error(rollout)
    accuracy = 1 if (error is None and rollout.accuracy == 1.0) else 0
    return {
        "task_id": rollout.task_id,
        "category": rollout.category or category_of(rollout.task_id),
        "accuracy": accuracy,
        "progress": rollout.progress,
        "failure_tags": list(rollout.failure_tags),
        "paper_labels": list(rollout.paper_labels),
        "num_model_calls": rollout.num_model_calls,
        "num_turns": rollout.num_turns,
        "stop_reason": rollout.stop_reason,
        "end_reason": result.get("end_reason"),
        "turns": result.get("turns"),
        # the service's cross-check of BFCL's verdict against the per-turn diagnosis (null: not graded)
        "consistent_with_turns": official.get("consistent_with_turns"),
        "messages": rollout.messages,
        "error": error,
        "rules": rules,
    }


CHECKER_RAISED = "BFCL's checker raised"  # in the error of a task whose grading raised inside BFCL's checker
CONTEXT_ERROR = "context window"  # how the error of a task whose first prompt does not fit begins


def first_prompt_error(rollout: Rollout) -> str | None:
    """The error of an episode stopped at the context window before its first model call, else None.

    The model never saw such a task: a context window smaller than the first prompt (a misconfigured server,
    a too small ``--max-model-len``) is a setup fault, and a 0 for it would read as the model's failure."""
    if rollout.stop_reason != "context_limit" or rollout.num_model_calls:
        return None
    detail = next((m["content"] for m in rollout.messages if m.get("role") == "error"), "")
    size = f" ({len(rollout.prompt_ids)} tokens)" if rollout.prompt_ids else ""
    return (f"{CONTEXT_ERROR}: the first prompt{size} does not fit the model's context (with room for one reply); "
            f"no model call was made{': ' + detail if detail else ''}")


def error_record(task_id: str, error: str, rules: str | None = None) -> dict[str, Any]:
    """The record of a task that could not be played at all (it counts as a failure)."""
    return record_from_rollout(Rollout(task_id=task_id, mode="eval", stop_reason="error"), error=error, rules=rules)


def record_category(record: Mapping[str, Any], index: int = 0) -> str:
    """A result record's category: its ``category`` field, else derived from ``task_id``."""
    category = record.get("category")
    if isinstance(category, str) and category:
        return category
    task_id = record.get("task_id")
    if isinstance(task_id, str) and task_id:
        return category_of(task_id)
    raise ValueError(f"record {index}: neither 'category' nor 'task_id' is set")


# --- summaries ----------------------------------------------------------------------------------------


def summary_from_results(records: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """Aggregate ``results.jsonl`` records into the ``summary.json`` shape.

    Returns ``{"n", "accuracy", "stderr", "count", "tag_counts", "label_counts", "checker_errors",
    "inconsistent_verdicts"}`` (the last two: task ids); ``average`` (mean of
    the category means) is present only when every category in the records is a BFCL V3 category and
    all four are present.
    """
    correct: Counter[str] = Counter()
    count: Counter[str] = Counter()
    tag_counts: dict[str, Counter[str]] = {}
    label_counts: dict[str, Counter[str]] = {}
    checker_errors: list[Any] = []  # tasks whose grading raised inside BFCL's checker (errored, accuracy 0)
    inconsistent: list[Any] = []  # tasks whose verdict disagrees with their per-turn diagnosis (reported)
    for index, record in enumerate(records):
        category = record_category(record, index)
        accuracy = record.get("accuracy")
        if not isinstance(accuracy, (int, float)) or isinstance(accuracy, bool) or accuracy not in (0, 1):
            raise ValueError(
                f"record {index} ({record.get('task_id')!r}): accuracy must be 0 or 1, got {accuracy!r}"
            )
        count[category] += 1
        correct[category] += int(accuracy)
        tag_counts.setdefault(category, Counter()).update(record.get("failure_tags") or [])
        label_counts.setdefault(category, Counter()).update(record.get("paper_labels") or [])
        if CHECKER_RAISED in (record.get("error") or ""):
            checker_errors.append(record.get("task_id"))
        if record.get("consistent_with_turns") is False:
            inconsistent.append(record.get("task_id"))
    accuracy = {c: correct[c] / count[c] for c in count}
    stderr = {c: binomial_stderr(accuracy[c], count[c]) for c in count}
    if set(count) == set(CATEGORIES):
        average = mean_estimate([Estimate(accuracy[c], stderr[c]) for c in CATEGORIES])
        accuracy[AVERAGE] = average.value
        stderr[AVERAGE] = average.stderr
    return {
        "n": sum(count.values()),
        "accuracy": accuracy,
        "stderr": stderr,
        "count": dict(count),
        "tag_counts": {c: dict(v) for c, v in tag_counts.items()},
        "label_counts": {c: dict(v) for c, v in label_counts.items()},
        "checker_errors": checker_errors,
        "inconsistent_verdicts": inconsistent,
    }


def build_summary(records: Sequence[Mapping[str, Any]], policy: str, split: str, wall_s: float,
                  notes: Sequence[str], rules: str | None = None, status: str = "complete") -> dict[str, Any]:
    """A held-in ``summary.json``: :func:`summary_from_results` plus the evaluation's identity and notes."""
    aggregate = summary_from_results(records) if records else {"n": 0, "accuracy": {}, "stderr": {}, "count": {},
                                                                  "tag_counts": {}, "label_counts": {},
                                                                  "checker_errors": [], "inconsistent_verdicts": []}
    return {"policy": policy, "split": split, "rules": rules, "status": status, **aggregate,
            "wall_s": round(wall_s, 3), "notes": list(notes)}


def ood_summary(records: Sequence[Mapping[str, Any]], split: str, policy: str, wall_s: float,
                notes: Sequence[str]) -> dict[str, Any]:
    """An OOD ``summary.json``: per key, the unweighted mean over its BFCL sub-categories (``bfcl_category``).

    Each key's `count` is its number of questions; with sub-categories of equal size (every full run) the mean
    equals the pooled fraction, so standard errors recomputed from `count` agree with ours."""
    parts: dict[str, dict[str, list[int]]] = {}
    for record in records:
        parts.setdefault(record["category"], {}).setdefault(record["bfcl_category"], []).append(record["accuracy"])
    accuracy, stderr, count, breakdown = {}, {}, {}, {}
    for key, subs in parts.items():
        means = {sub: sum(v) / len(v) for sub, v in subs.items()}
        errors = {sub: binomial_stderr(means[sub], len(v)) for sub, v in subs.items()}
        accuracy[key] = sum(means.values()) / len(means)
        stderr[key] = math.sqrt(sum(e * e for e in errors.values())) / len(means)
        count[key] = sum(len(v) for v in subs.values())
        for sub, values in subs.items():
            breakdown[sub] = {"accuracy": means[sub], "stderr": errors[sub], "count": len(values)}
    return {"policy": policy, "split": split, "n": len(records), "accuracy": accuracy, "stderr": stderr,
            "count": count, "breakdown": breakdown, "tag_counts": {}, "label_counts": {},
            "wall_s": round(wall_s, 3), "notes": list(notes)}


# --- writing ------------------------------------------------------------------------------------------


def write_jsonl(path: Path, rows: Iterable[Mapping[str, Any]]) -> None:
    with open(path, "w", encoding="utf-8") as handle:
        for row in rows:
            handle.write(json.dumps(scrub_data(row), ensure_ascii=False) + "\n")


def write_summary(out: Path, summary: Mapping[str, Any]) -> None:
    text = json.dumps(scrub_data(summary), indent=2, ensure_ascii=False)
    (out / SUMMARY_FILE).write_text(text + "\n", encoding="utf-8")


def write_eval_dir(out: Path, records: Sequence[Mapping[str, Any]], summary: Mapping[str, Any],
                   extra: Mapping[str, Sequence[Mapping[str, Any]]] | None = None) -> None:
    """Write ``results.jsonl``, ``summary.json`` and any ``extra`` JSONL files (name -> rows) into `out`."""
    out.mkdir(parents=True, exist_ok=True)
    write_jsonl(out / RESULTS_FILE, records)
    for name, rows in (extra or {}).items():
        write_jsonl(out / name, rows)
    write_summary(out, summary)


class ResultsLog:
    """``results.jsonl`` of a running evaluation: each record appended (and flushed) as its task finishes.

    ``ResultsLog(out, resume=True)`` keeps the records already there (read back with :meth:`records`; a
    last line cut off by a kill is dropped); without `resume` the file starts empty."""

    def __init__(self, out: Path, resume: bool = False):
        out.mkdir(parents=True, exist_ok=True)
        self.path = out / RESULTS_FILE
        self.kept: list[dict[str, Any]] = []
        if resume and self.path.is_file():
            for line in self.path.read_text(encoding="utf-8").splitlines():
                try:
                    record = json.loads(line)
                except json.JSONDecodeError:
                    continue  # a line half-written when the process was killed: that task is played again
                if isinstance(record, dict) and isinstance(record.get("task_id"), str):
                    self.kept.append(record)
        write_jsonl(self.path, self.kept)  # rewrite without any cut-off line
        self._handle = open(self.path, "a", encoding="utf-8")  # noqa: SIM115 - held for the whole evaluation

    def append(self, record: Mapping[str, Any]) -> None:
        self._handle.write(json.dumps(scrub_data(record), ensure_ascii=False) + "\n")
        self._handle.flush()

    def close(self) -> None:
        self._handle.close()


def write_ordered(out: Path, records: Sequence[Mapping[str, Any]], order: Sequence[str]) -> list[Mapping[str, Any]]:
    """Rewrite ``results.jsonl`` with one record per task, in `order` (tasks without a record left out),
    through a temporary file so the file is never half-written. Returns the records written."""
    by_id = {r["task_id"]: r for r in records}
    ordered = [by_id[t] for t in order if t in by_id]
    tmp = out / (RESULTS_FILE + ".tmp")
    write_jsonl(tmp, ordered)
    tmp.replace(out / RESULTS_FILE)
    return ordered


# --- reading ------------------------------------------------------------------------------------------


def resolve_eval_dir(path: str | Path) -> Path:
    """An evaluation directory from a path to one, or to a run directory: its ``eval/last``, else its only
    evaluation, else its only ``eval/last_*`` (a subset or other rules, as ``seal-eval --run`` names them).

    A run directory resolves to its last checkpoint's evaluation: validation uses the 400 held-in tasks, so
    ``eval/best*`` is selected on the test set and is optimistic, and is never taken by itself; name it explicitly to
    report it. Several ``last_*`` (or none, beside other evaluations) are an error naming the candidates."""
    path = Path(path)
    if (path / SUMMARY_FILE).is_file() or (path / RESULTS_FILE).is_file():
        return path
    last = RunDir(path).eval_dir("last")
    eval_root = last.parent
    if eval_root.is_dir():
        if last.is_dir():
            return resolve_eval_dir(last)
        candidates = sorted(p for p in eval_root.iterdir() if p.is_dir())
        lasts = [p for p in candidates if p.name.startswith("last_")]
        if len(candidates) == 1 or len(lasts) == 1:
            return resolve_eval_dir(candidates[0] if len(candidates) == 1 else lasts[0])
        names = [p.name for p in candidates]
        why = f"several last checkpoint evaluations {[p.name for p in lasts]}" if lasts else "no last_* evaluation"
        raise ValueError(f"{path}: run directory has evaluations {names} ({why}); name one (e.g. {eval_root}/<name>)")
    raise ValueError(
        f"{path}: not an evaluation directory (no summary.json or results.jsonl) nor a run directory"
    )


def read_jsonl(path: str | Path) -> list[dict[str, Any]]:
    """The objects of a JSON-lines file (``results.jsonl``, ``metrics.jsonl``); blank lines skipped."""
    records = []
    with open(path, encoding="utf-8") as handle:
        for number, line in enumerate(handle, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ValueError(f"{path}:{number}: not JSON ({exc.msg})") from None
            if not isinstance(record, dict):
                raise EvalDataError(f"{path}:{number}: expected a JSON object")
            records.append(record)
    return records


def read_records(path: str | Path) -> list[dict[str, Any]]:
    """The records of an evaluation directory (or a run directory: its ``eval/last``, else its only evaluation)."""
    directory = resolve_eval_dir(path)
    results = directory / RESULTS_FILE
    if not results.is_file():
        raise ValueError(f"{directory}: no results.jsonl (a failure report needs per-task records)")
    return read_jsonl(results)


def read_summary(path: str | Path) -> dict[str, Any]:
    """An evaluation directory's summary: ``summary.json``, else aggregated from ``results.jsonl``."""
    directory = resolve_eval_dir(path)
    summary_path = directory / SUMMARY_FILE
    if summary_path.is_file():
        try:
            summary = json.loads(summary_path.read_text(encoding="utf-8"))
        except json.JSONDecodeError as exc:
            raise ValueError(f"{summary_path}: not JSON ({exc.msg})") from None
        if not isinstance(summary, dict):
            raise EvalDataError(f"{summary_path}: expected a JSON object")
        return summary
    return summary_from_results(read_jsonl(directory / RESULTS_FILE))

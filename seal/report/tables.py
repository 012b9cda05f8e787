"""The paper's tables, rendered as markdown from our evaluation directories beside the paper's numbers.

Pure functions do the work (estimates, formatting, rendering); the few readers at the bottom turn an
evaluation directory (``docs/run_directory.md``) into estimates. ``scripts/make_tables.py`` is the CLI.

Numbers: our accuracies are fractions in [0, 1] and print as percent with two decimals and the binomial
standard error, ``37.00 ± 4.83`` for 37/100; an average of k parts carries sqrt(Σ se²)/k. The paper
column prints the paper's percent; Δ = ours (as printed) − paper, in percentage points.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from env_service.vocab import CATEGORIES, category_of
from seal.report import paper_numbers as pn
from seal.report.paper_numbers import Row
from seal.run_dir import RunDir

MISSING = "–"


class EvalDataError(ValueError):
    """An evaluation directory, summary or mapping file that does not follow docs/run_directory.md."""


# Keys an OOD evaluation summary may carry under "accuracy" / "count" (docs/run_directory.md, extension).
OOD_PARTS: tuple[str, ...] = tuple(part for parts in pn.OOD_SUITES.values() for part in parts)


@dataclass(frozen=True)
class Estimate:
    """A success rate: ``value`` is a fraction in [0, 1], ``stderr`` its standard error (None if unknown)."""

    value: float
    stderr: float | None = None
    n: int | None = None

    def __post_init__(self) -> None:
        if not (0.0 <= self.value <= 1.0) or math.isnan(self.value):
            raise ValueError(
                f"accuracy {self.value!r} is not a fraction in [0, 1] (percentages are not accepted)"
            )
        if self.stderr is not None and (self.stderr < 0 or math.isnan(self.stderr)):
            raise ValueError(f"standard error {self.stderr!r} must be >= 0")
        if self.n is not None and self.n <= 0:
            raise ValueError(f"sample size {self.n!r} must be positive")


def binomial_stderr(p: float, n: int) -> float:
    """Binomial standard error sqrt(p (1 - p) / n) of a success fraction ``p`` over ``n`` trials."""
    if n <= 0:
        raise ValueError(f"n must be positive, got {n}")
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"p must be in [0, 1], got {p}")
    return math.sqrt(p * (1.0 - p) / n)


def binomial_estimate(p: float, n: int | None, stderr: float | None = None) -> Estimate:
    """An estimate whose standard error comes from ``n`` when known, else from ``stderr`` as given."""
    if n is not None:
        return Estimate(p, binomial_stderr(p, n), n)
    return Estimate(p, stderr)


def mean_estimate(parts: Sequence[Estimate]) -> Estimate:
    """Unweighted mean of independent estimates; stderr sqrt(Σ se²)/k (None if any part lacks one)."""
    if not parts:
        raise ValueError("mean of no estimates")
    k = len(parts)
    value = sum(part.value for part in parts) / k
    errors = [part.stderr for part in parts if part.stderr is not None]
    stderr = math.sqrt(sum(e * e for e in errors)) / k if len(errors) == k else None
    counts = [part.n for part in parts if part.n is not None]
    n = sum(counts) if len(counts) == k else None
    # Clamp float noise so the mean of fractions stays a fraction.
    return Estimate(min(max(value, 0.0), 1.0), stderr, n)


# --- summaries ----------------------------------------------------------------------------------


def summary_from_results(records: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """Aggregate ``results.jsonl`` records into the ``summary.json`` shape (``docs/run_directory.md``).

    Returns ``{"n", "accuracy", "stderr", "count", "tag_counts", "label_counts"}``; ``average`` (mean of
    the category means) is present only when every category in the records is a BFCL V3 category and
    all four are present.
    """
    correct: Counter[str] = Counter()
    count: Counter[str] = Counter()
    tag_counts: dict[str, Counter[str]] = {}
    label_counts: dict[str, Counter[str]] = {}
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
    accuracy = {c: correct[c] / count[c] for c in count}
    stderr = {c: binomial_stderr(accuracy[c], count[c]) for c in count}
    if set(count) == set(CATEGORIES):
        average = mean_estimate([Estimate(accuracy[c], stderr[c]) for c in CATEGORIES])
        accuracy[pn.AVERAGE] = average.value
        stderr[pn.AVERAGE] = average.stderr
    return {
        "n": sum(count.values()),
        "accuracy": accuracy,
        "stderr": stderr,
        "count": dict(count),
        "tag_counts": {c: dict(v) for c, v in tag_counts.items()},
        "label_counts": {c: dict(v) for c, v in label_counts.items()},
    }


def record_category(record: Mapping[str, Any], index: int = 0) -> str:
    """A result record's category: its ``category`` field, else derived from ``task_id``."""
    category = record.get("category")
    if isinstance(category, str) and category:
        return category
    task_id = record.get("task_id")
    if isinstance(task_id, str) and task_id:
        return category_of(task_id)
    raise ValueError(f"record {index}: neither 'category' nor 'task_id' is set")


def estimates_from_summary(summary: Mapping[str, Any], allowed: Iterable[str]) -> dict[str, Estimate]:
    """Per-key estimates from a ``summary.json`` dict; keys outside ``allowed`` (and ``average``) are an error.

    Standard errors are recomputed from ``count`` when it is given (so every number in a table uses the
    same formula) and taken from ``stderr`` otherwise.
    """
    accuracy = summary.get("accuracy")
    if not isinstance(accuracy, Mapping) or not accuracy:
        raise ValueError("summary has no 'accuracy' mapping")
    counts = summary.get("count") or {}
    errors = summary.get("stderr") or {}
    allowed = set(allowed)
    unknown = sorted(set(accuracy) - allowed - {pn.AVERAGE})
    if unknown:
        raise ValueError(f"summary accuracy keys {unknown} are not among the expected {sorted(allowed)}")
    out: dict[str, Estimate] = {}
    for key, value in accuracy.items():
        if key == pn.AVERAGE:
            continue
        n = counts.get(key)
        if n is not None and (not isinstance(n, int) or isinstance(n, bool)):
            raise ValueError(f"summary count for {key!r} must be an integer, got {n!r}")
        out[key] = binomial_estimate(float(value), n, errors.get(key))
    return out


def held_in_estimates(summary: Mapping[str, Any]) -> dict[str, Estimate]:
    """Estimates for the BFCL V3 table: the four categories and, when all are present, their average.

    The average is recomputed as the mean of the category means (the definition in
    ``docs/run_directory.md``); a summary whose own ``average`` disagrees by more than 1e-4 is refused.
    """
    out = estimates_from_summary(summary, CATEGORIES)
    if all(c in out for c in CATEGORIES):
        out[pn.AVERAGE] = mean_estimate([out[c] for c in CATEGORIES])
        given = summary["accuracy"].get(pn.AVERAGE)
        if given is not None and abs(float(given) - out[pn.AVERAGE].value) > 1e-4:
            raise ValueError(
                f"summary average {given} differs from the mean of its category accuracies "
                f"{out[pn.AVERAGE].value:.6f}"
            )
    elif pn.AVERAGE in summary["accuracy"]:
        average = summary["accuracy"][pn.AVERAGE]
        out[pn.AVERAGE] = Estimate(float(average), (summary.get("stderr") or {}).get(pn.AVERAGE))
    return out


def ood_estimates(summaries: Sequence[Mapping[str, Any]]) -> dict[str, Estimate]:
    """Estimates for the OOD table from one or more OOD summaries (e.g. one BFCL V4, one τ²).

    Sub-benchmark keys (:data:`OOD_PARTS`) may come from different summaries but not twice; each suite
    average (``bfcl_v4_average``, ``tau2_average``) is the unweighted mean of its parts when all are there.
    """
    out: dict[str, Estimate] = {}
    for summary in summaries:
        for key, estimate in estimates_from_summary(summary, OOD_PARTS).items():
            if key in out:
                raise ValueError(f"OOD metric {key!r} is given by more than one evaluation directory")
            out[key] = estimate
    for suite, parts in pn.OOD_SUITES.items():
        if all(part in out for part in parts):
            out[suite] = mean_estimate([out[part] for part in parts])
    return out


# --- formatting ---------------------------------------------------------------------------------


def format_estimate(estimate: Estimate | None) -> str:
    """``37.00 ± 4.83`` (percent), ``37.00`` without a standard error, ``–`` without data."""
    if estimate is None:
        return MISSING
    text = f"{100.0 * estimate.value:.2f}"
    if estimate.stderr is not None:
        text += f" ± {100.0 * estimate.stderr:.2f}"
    return text


def format_percent(value: float | None) -> str:
    """A paper number (already percent) with two decimals, or ``–``."""
    return MISSING if value is None else f"{value:.2f}"


def delta_points(ours: Estimate | None, paper: float | None) -> float | None:
    """Ours (rounded as printed) minus the paper, in percentage points; None when either is missing."""
    if ours is None or paper is None:
        return None
    return round(100.0 * ours.value, 2) - paper


def format_delta(delta: float | None) -> str:
    """Signed two-decimal delta (``+1.25``, ``-3.00``, ``0.00``) or ``–``."""
    if delta is None:
        return MISSING
    if abs(delta) < 0.005:
        return "0.00"
    return f"{delta:+.2f}"


# --- tables -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TableSpec:
    """What one paper table shows: its metrics (columns) and the paper's rows and numbers."""

    title: str
    metrics: tuple[str, ...]
    headers: Mapping[str, str]
    paper: Mapping[Row, Mapping[str, float]]
    trainings: tuple[str, ...]  # training variants whose extra (non-paper) rows this table also shows
    note: str = ""


def _row_order(row: Row) -> tuple[int, int]:
    return pn.BACKBONES.index(row.backbone), tuple(pn.TRAINING_LABELS).index(row.training)


def table_rows(spec: TableSpec, ours: Mapping[Row, Mapping[str, Estimate]]) -> list[Row]:
    """The paper's rows in the paper's order, then rows we have data for that the paper lacks."""
    rows = list(spec.paper)
    extra = [row for row in ours if row not in spec.paper and row.training in spec.trainings and ours[row]]
    return rows + sorted(extra, key=_row_order)


def row_label(row: Row) -> str:
    """The row's first cell: the backbone, or ``<backbone> + <training>`` (unambiguous, unlike the paper's
    indented ``+ SEAL``, so the markdown can be grepped and diffed)."""
    label = pn.TRAINING_LABELS[row.training]
    return f"{row.backbone} + {label}" if label else row.backbone


def render_table(spec: TableSpec, ours: Mapping[Row, Mapping[str, Estimate]]) -> str:
    """A markdown table: per metric, our estimate, the paper's number and the delta."""
    header = ["Model / training"]
    for metric in spec.metrics:
        name = spec.headers[metric]
        header += [f"{name} (ours)", f"{name} (paper)", f"{name} Δ"]
    lines = [f"### {spec.title}", ""]
    if spec.note:
        lines += [spec.note, ""]
    lines += ["| " + " | ".join(header) + " |", "|" + "---|" + "---:|" * (len(header) - 1)]
    for row in table_rows(spec, ours):
        mine = ours.get(row, {})
        theirs = spec.paper.get(row, {})
        cells = [row_label(row)]
        for metric in spec.metrics:
            estimate = mine.get(metric)
            paper_value = theirs.get(metric)
            cells += [
                format_estimate(estimate),
                format_percent(paper_value),
                format_delta(delta_points(estimate, paper_value)),
            ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def held_in_spec() -> TableSpec:
    return TableSpec(
        title="BFCL V3 multi-turn (held-in, 400 tasks, 100 per category), success %",
        metrics=pn.HELD_IN_METRICS,
        headers=pn.HELD_IN_HEADERS,
        paper={row: scores.as_metrics() for row, scores in pn.HELD_IN.items()},
        trainings=(pn.BASE, pn.VANILLA_RL, pn.SEAL),
    )


def ood_spec() -> TableSpec:
    return TableSpec(
        title="Out-of-distribution: BFCL V4 (Web Search, Memory) and τ²-bench (Retail, Airline, Telecom), success %",
        metrics=pn.OOD_METRICS,
        headers=pn.OOD_HEADERS,
        paper={row: scores.as_metrics() for row, scores in pn.OOD.items()},
        trainings=tuple(pn.TRAINING_LABELS),
        note="Suite averages are unweighted means of their parts. The paper prints 5.98 as the BFCL V4 "
        "average of Qwen2.5-3B + Vanilla RL; its parts average to 5.88.",
    )


def ablation_spec() -> TableSpec:
    return TableSpec(
        title="Ablation (Qwen2.5-7B-Instruct, BFCL V3 held-in), success %",
        metrics=pn.HELD_IN_METRICS,
        headers=pn.HELD_IN_HEADERS,
        paper={row: scores.as_metrics() for row, scores in pn.ABLATION.items()},
        trainings=(pn.WO_ENV_ADAPTATION, pn.WO_REWEIGHTING, pn.WO_CLOSED_LOOP),
    )


def render_reference_points() -> str:
    lines = [
        "### Reference points (paper, not controlled), average success %",
        "",
        "| Model | Average |",
        "|---|---:|",
    ]
    lines += [f"| {name} | {value:.2f} |" for name, value in pn.REFERENCE_POINTS.items()]
    return "\n".join(lines) + "\n"


TABLES: tuple[str, ...] = ("held_in", "ood", "ablation")


def render_tables(
    held_in: Mapping[Row, Mapping[str, Estimate]],
    ood: Mapping[Row, Mapping[str, Estimate]],
    tables: Sequence[str] = TABLES,
) -> str:
    """All requested tables as one markdown document (held-in also lists the reference points)."""
    unknown = [t for t in tables if t not in TABLES]
    if unknown:
        raise ValueError(f"unknown tables {unknown}; expected some of {TABLES}")
    parts = [
        "## SEAL reproduction vs paper",
        "",
        "Ours: percent ± binomial standard error; paper: as printed; Δ = ours − paper (points).",
        "",
    ]
    if "held_in" in tables:
        parts += [render_table(held_in_spec(), held_in), render_reference_points()]
    if "ood" in tables:
        parts.append(render_table(ood_spec(), ood))
    if "ablation" in tables:
        parts.append(render_table(ablation_spec(), held_in))
    return "\n".join(parts)


# --- reading evaluation directories -------------------------------------------------------------


def resolve_eval_dir(path: str | Path) -> Path:
    """An evaluation directory from a path to one, or to a run directory holding exactly one (or ``eval/last``).

    A run directory resolves to its last checkpoint's evaluation: validation uses the 400 held-in tasks, so
    ``eval/best`` is selected on the test set and is optimistic; name it explicitly to report it."""
    path = Path(path)
    if (path / "summary.json").is_file() or (path / "results.jsonl").is_file():
        return path
    last = RunDir(path).eval_dir("last")
    eval_root = last.parent
    if eval_root.is_dir():
        if last.is_dir():
            return resolve_eval_dir(last)
        candidates = sorted(p for p in eval_root.iterdir() if p.is_dir())
        if len(candidates) == 1:
            return resolve_eval_dir(candidates[0])
        names = [p.name for p in candidates]
        raise ValueError(f"{path}: run directory has evaluations {names}; name one (e.g. {eval_root}/<name>)")
    raise ValueError(
        f"{path}: not an evaluation directory (no summary.json or results.jsonl) nor a run directory"
    )


def read_results(path: str | Path) -> list[dict[str, Any]]:
    """The records of a ``results.jsonl`` file (one JSON object per line; blank lines skipped)."""
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


def read_summary(path: str | Path) -> dict[str, Any]:
    """An evaluation directory's summary: ``summary.json``, else aggregated from ``results.jsonl``."""
    directory = resolve_eval_dir(path)
    summary_path = directory / "summary.json"
    if summary_path.is_file():
        try:
            summary = json.loads(summary_path.read_text(encoding="utf-8"))
        except json.JSONDecodeError as exc:
            raise ValueError(f"{summary_path}: not JSON ({exc.msg})") from None
        if not isinstance(summary, dict):
            raise EvalDataError(f"{summary_path}: expected a JSON object")
        return summary
    return summary_from_results(read_results(directory / "results.jsonl"))


def load_held_in(mapping: Mapping[str, str | Path]) -> dict[Row, dict[str, Estimate]]:
    """Row key -> evaluation directory, read into table estimates (errors name the offending row)."""
    out: dict[Row, dict[str, Estimate]] = {}
    for key, directory in mapping.items():
        row = pn.parse_row(key)
        if row in out:
            raise ValueError(f"row {row.key} is given twice")
        try:
            out[row] = held_in_estimates(read_summary(directory))
        except (OSError, ValueError) as exc:
            raise ValueError(f"row {row.key} ({directory}): {exc}") from None
    return out


def load_ood(mapping: Mapping[str, Sequence[str | Path]]) -> dict[Row, dict[str, Estimate]]:
    """Row key -> OOD evaluation directories (e.g. a BFCL V4 and a τ² one), read into table estimates."""
    out: dict[Row, dict[str, Estimate]] = {}
    for key, directories in mapping.items():
        row = pn.parse_row(key)
        if row in out:
            raise ValueError(f"row {row.key} is given twice")
        try:
            out[row] = ood_estimates([read_summary(d) for d in directories])
        except (OSError, ValueError) as exc:
            raise ValueError(f"row {row.key} ({', '.join(map(str, directories))}): {exc}") from None
    return out


# --- command-line inputs ------------------------------------------------------------------------


def parse_assignment(text: str) -> tuple[str, str]:
    """``"KEY=DIR"`` -> ``("KEY", "DIR")`` (split at the first ``=``; both sides required)."""
    key, sep, value = text.partition("=")
    if not sep or not key.strip() or not value.strip():
        raise ValueError(f"expected KEY=DIR, got {text!r}")
    return key.strip(), value.strip()


def pairs_from_mapping_file(
    document: Any, base_dir: Path
) -> tuple[list[tuple[str, Path]], list[tuple[str, Path]]]:
    """Held-in and OOD (row key, directory) pairs from a parsed mapping file (YAML or JSON).

    Shape: ``{"held_in": {KEY: DIR}, "ood": {KEY: DIR or [DIR, ...]}}``; both sections optional; relative
    directories are resolved against ``base_dir`` (the mapping file's folder).
    """
    if not isinstance(document, Mapping):
        raise EvalDataError("mapping file must hold a mapping with 'held_in' and/or 'ood'")
    unknown = sorted(set(document) - {"held_in", "ood"})
    if unknown:
        raise ValueError(f"mapping file: unknown sections {unknown}; expected 'held_in' and/or 'ood'")

    def directory(value: Any, where: str) -> Path:
        if not isinstance(value, str) or not value:
            raise ValueError(f"mapping file: {where} must be a directory path, got {value!r}")
        path = Path(value)
        return path if path.is_absolute() else base_dir / path

    held_in: list[tuple[str, Path]] = []
    ood: list[tuple[str, Path]] = []
    for section, target in (("held_in", held_in), ("ood", ood)):
        entries = document.get(section) or {}
        if not isinstance(entries, Mapping):
            raise EvalDataError(f"mapping file: '{section}' must map row keys to directories")
        for key, value in entries.items():
            values = value if isinstance(value, list) and section == "ood" else [value]
            target += [(str(key), directory(v, f"{section}.{key}")) for v in values]
    return held_in, ood


def held_in_mapping(pairs: Iterable[tuple[str, str | Path]]) -> dict[str, str | Path]:
    """Held-in pairs as a mapping; a row key given twice is an error."""
    out: dict[str, str | Path] = {}
    for key, directory in pairs:
        if key in out:
            raise ValueError(f"held-in row {key!r} is given twice ({out[key]} and {directory})")
        out[key] = directory
    return out


def ood_mapping(pairs: Iterable[tuple[str, str | Path]]) -> dict[str, list[str | Path]]:
    """OOD pairs grouped by row key (a row may draw on several OOD evaluation directories)."""
    out: dict[str, list[str | Path]] = {}
    for key, directory in pairs:
        out.setdefault(key, []).append(directory)
    return out

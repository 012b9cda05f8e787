"""Failure-analysis reports from an evaluation directory's ``results.jsonl`` (``docs/run_directory.md``).

A report gives, per category, the success rate and the distribution of per-turn diagnoses in both
vocabularies (``env_service.vocab``): the release's progress tags (``failure_tags``) and the paper's
labels (``paper_labels``), as counts and shares of that category's turns. A comparison of two
evaluations gives the accuracy deltas and the change of each share, per category, in points.

Everything here is pure except :func:`load_results`; ``scripts/failure_report.py`` is the CLI.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from env_service.vocab import CATEGORIES, PAPER_LABELS, PROGRESS_TAGS
from seal.eval.results import AVERAGE, read_records, record_category, summary_from_results
from seal.eval.stats import Estimate, binomial_estimate, format_estimate, mean_estimate
from seal.report.tables import format_delta

ALL = "all"
# results.jsonl field -> (heading, vocabulary whose order the rows follow)
FIELDS: Mapping[str, tuple[str, tuple[str, ...]]] = {
    "failure_tags": ("Failure tags (progress vocabulary)", PROGRESS_TAGS),
    "paper_labels": ("Paper labels", PAPER_LABELS),
}


@dataclass(frozen=True)
class Distribution:
    """Per-turn diagnosis counts of one field: ``counts[category][tag]``, ``turns[category]`` (including
    the pooled category :data:`ALL`), and ``vocabulary`` (tags in display order; unknown ones last)."""

    counts: Mapping[str, Mapping[str, int]]
    turns: Mapping[str, int]
    vocabulary: tuple[str, ...]
    unknown: tuple[str, ...]

    def share(self, category: str, tag: str) -> float | None:
        """Share of ``category``'s turns tagged ``tag``; None when the category has no tagged turns."""
        turns = self.turns.get(category, 0)
        return None if turns == 0 else self.counts.get(category, {}).get(tag, 0) / turns


def category_order(categories: set[str]) -> list[str]:
    """BFCL categories in their canonical order, others (e.g. OOD suites) after them, sorted."""
    return [c for c in CATEGORIES if c in categories] + sorted(categories - set(CATEGORIES))


def tag_distribution(records: Sequence[Mapping[str, Any]], field: str) -> Distribution:
    """Count the per-turn diagnoses in ``field`` (``failure_tags`` or ``paper_labels``) per category."""
    if field not in FIELDS:
        raise ValueError(f"unknown diagnosis field {field!r}; expected one of {tuple(FIELDS)}")
    counts: dict[str, Counter[str]] = {}
    for index, record in enumerate(records):
        category = record_category(record, index)
        tags = record.get(field) or []
        if not isinstance(tags, list) or not all(isinstance(t, str) for t in tags):
            raise ValueError(f"record {index} ({record.get('task_id')!r}): {field} must be a list of strings")
        counts.setdefault(category, Counter()).update(tags)
    pooled: Counter[str] = Counter()
    for counter in counts.values():
        pooled.update(counter)
    counts[ALL] = pooled
    vocabulary = FIELDS[field][1]
    unknown = tuple(sorted(set(pooled) - set(vocabulary)))
    return Distribution(
        counts={c: dict(v) for c, v in counts.items()},
        turns={c: sum(v.values()) for c, v in counts.items()},
        vocabulary=(*vocabulary, *unknown),
        unknown=unknown,
    )


def accuracy_by_category(records: Sequence[Mapping[str, Any]]) -> dict[str, Estimate]:
    """Success rate ± binomial error per category, and ``average`` (mean of the four BFCL category means,
    as in ``docs/run_directory.md``) when all four are present."""
    summary = summary_from_results(records)
    counts = summary["count"]
    out = {c: binomial_estimate(summary["accuracy"][c], counts[c]) for c in category_order(set(counts))}
    if all(c in out for c in CATEGORIES):
        out[AVERAGE] = mean_estimate([out[c] for c in CATEGORIES])
    return out


def _pct(value: float | None) -> str:
    return "–" if value is None else f"{100.0 * value:.2f}%"


def _table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|---|" + "---:|" * (len(header) - 1)]
    return lines + ["| " + " | ".join(row) + " |" for row in rows]


def _distribution_section(distribution: Distribution, heading: str) -> list[str]:
    columns = [*category_order(set(distribution.counts) - {ALL}), ALL]
    rows = []
    for tag in distribution.vocabulary:
        name = f"{tag} *" if tag in distribution.unknown else tag
        cells = [name]
        for category in columns:
            count = distribution.counts.get(category, {}).get(tag, 0)
            cells.append(f"{count} ({_pct(distribution.share(category, tag))})")
        rows.append(cells)
    rows.append(["turns", *(str(distribution.turns.get(c, 0)) for c in columns)])
    lines = [f"## {heading}, per turn", "", "Cells: count (share of the category's turns).", ""]
    lines += _table(["Tag", *columns], rows)
    if distribution.unknown:
        lines += [
            "",
            f"\\* not in the vocabulary of `env_service/vocab.py`: {', '.join(distribution.unknown)}",
        ]
    return lines + [""]


def render_report(records: Sequence[Mapping[str, Any]], title: str) -> str:
    """Markdown: tasks, accuracy per category, and both per-turn diagnosis distributions."""
    if not records:
        raise ValueError("no result records")
    errors = sum(1 for r in records if r.get("error"))
    accuracy = accuracy_by_category(records)
    tasks = Counter(record_category(r, i) for i, r in enumerate(records))
    lines = [
        f"# Failure report: {title}",
        "",
        f"Tasks: {len(records)}; tasks with a harness error: {errors}.",
        "",
        "## Success per category",
        "",
    ]
    lines += _table(
        ["Category", "Tasks", "Success (%)"],
        [
            [c, str(tasks[c]) if c in tasks else str(len(records)), format_estimate(e)]
            for c, e in accuracy.items()
        ],
    )
    lines.append("")
    for field, (heading, _) in FIELDS.items():
        lines += _distribution_section(tag_distribution(records, field), heading)
    lines += _failed_tasks_section(records)
    return "\n".join(lines)


def failed_tasks(records: Sequence[Mapping[str, Any]]) -> list[list[str]]:
    """One row per failed task, in category then record order: task id (to look the task up, e.g. in
    `results.jsonl` or BFCL's data), category, the per-turn paper labels and failure tags, the harness error."""
    failed = [(record_category(r, i), i, r) for i, r in enumerate(records) if r.get("accuracy") != 1]
    order = {c: k for k, c in enumerate(category_order({c for c, _, _ in failed}))}
    failed.sort(key=lambda item: (order[item[0]], item[1]))
    return [[str(r.get("task_id", f"record {i}")), c, " ".join(r.get("paper_labels") or []) or "–",
             " ".join(r.get("failure_tags") or []) or "–", str(r.get("error") or "").replace("|", "/")[:120] or "–"]
            for c, i, r in failed]


def _failed_tasks_section(records: Sequence[Mapping[str, Any]]) -> list[str]:
    rows = failed_tasks(records)
    lines = ["## Failed tasks", "", f"{len(rows)} task(s); labels and tags per user turn, in order.", ""]
    if rows:
        lines += _table(["Task", "Category", "Paper labels", "Failure tags", "Error"], rows)
    return lines + [""]


def share_delta(before: Distribution, after: Distribution, category: str, tag: str) -> float | None:
    """Change of a tag's share of the category's turns, after − before, in points, from the shares as
    printed (two decimals) so the delta matches the printed pair; None if either side lacks turns."""
    a, b = before.share(category, tag), after.share(category, tag)
    return None if a is None or b is None else round(100.0 * b, 2) - round(100.0 * a, 2)


def render_comparison(
    before: Sequence[Mapping[str, Any]],
    after: Sequence[Mapping[str, Any]],
    before_label: str,
    after_label: str,
) -> str:
    """Markdown: accuracy per category of both evaluations and Δ, then per-turn share changes per tag."""
    if not before or not after:
        raise ValueError("both evaluations need result records")
    acc_a, acc_b = accuracy_by_category(before), accuracy_by_category(after)
    keys = category_order((set(acc_a) | set(acc_b)) - {AVERAGE})
    if AVERAGE in acc_a or AVERAGE in acc_b:
        keys.append(AVERAGE)
    lines = [f"# Change: {after_label} vs {before_label}", "", "## Success per category", ""]
    rows = []
    for key in keys:
        a, b = acc_a.get(key), acc_b.get(key)
        delta = None if a is None or b is None else round(100.0 * b.value, 2) - round(100.0 * a.value, 2)
        rows.append([key, format_estimate(a), format_estimate(b), format_delta(delta)])
    lines += _table(["Category", before_label, after_label, "Δ (points)"], rows)
    lines.append("")
    for field, (heading, _) in FIELDS.items():
        dist_a, dist_b = tag_distribution(before, field), tag_distribution(after, field)
        columns = [*category_order((set(dist_a.counts) | set(dist_b.counts)) - {ALL}), ALL]
        unknown = tuple(sorted(set(dist_a.unknown) | set(dist_b.unknown)))
        vocabulary = (*FIELDS[field][1], *unknown)
        rows = []
        for tag in vocabulary:
            cells = [f"{tag} *" if tag in unknown else tag]
            for category in columns:
                delta = share_delta(dist_a, dist_b, category, tag)
                shares = f"{_pct(dist_a.share(category, tag))} → {_pct(dist_b.share(category, tag))}"
                cells.append(f"{format_delta(delta)} ({shares})")
            rows.append(cells)
        lines += [
            f"## {heading}: change of the share of turns (points)",
            "",
            f"Cells: Δ share ({before_label} → {after_label}).",
            "",
        ]
        lines += _table(["Tag", *columns], rows)
        if unknown:
            lines += ["", f"\\* not in the vocabulary of `env_service/vocab.py`: {', '.join(unknown)}"]
        lines.append("")
    return "\n".join(lines)


def load_results(path: str | Path) -> list[dict[str, Any]]:
    """The records of an evaluation directory (or a run directory: its ``eval/last``, else its only evaluation)."""
    return read_records(path)

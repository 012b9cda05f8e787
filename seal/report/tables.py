"""The paper's tables, rendered as markdown from our evaluation directories beside the paper's numbers.

Pure functions do the work (summary -> estimates, formatting, rendering); ``load_held_in`` / ``load_ood``
read evaluation directories through ``seal.eval.results`` (the schema, ``docs/run_directory.md``); the
statistics and their printed form come from ``seal.eval.stats``. ``scripts/make_tables.py`` is the CLI.

Numbers: our accuracies are fractions in [0, 1] and print as percent with two decimals and the binomial
standard error, ``37.00 ± 4.83`` for 37/100; an average of k parts carries sqrt(Σ se²)/k. The paper
column prints the paper's percent; Δ = ours (as printed) − paper, in percentage points.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from env_service.rules import DESCRIPTIONS, RELEASE
from env_service.vocab import CATEGORIES
from seal.eval.results import AVERAGE, HELD_IN_HEADERS, HELD_IN_METRICS, EvalDataError, read_summary
from seal.eval.stats import MISSING, Estimate, binomial_estimate, format_estimate, mean_estimate
from seal.eval.taubench.harness import protocol_differences
from seal.report import paper_numbers as pn
from seal.report.paper_numbers import Row

# Keys an OOD evaluation summary may carry under "accuracy" / "count" (docs/run_directory.md, extension).
OOD_PARTS: tuple[str, ...] = tuple(part for parts in pn.OOD_SUITES.values() for part in parts)
# τ² columns: placed beside the paper's only for runs under the paper's τ² protocol (seal.eval.taubench.harness.PAPER)
TAU2_METRICS: tuple[str, ...] = (pn.TAU2_AVERAGE, *pn.OOD_SUITES[pn.TAU2_AVERAGE])
BFCL_V4_PARTS: Mapping[str, tuple[str, ...]] = {
    "memory": ("memory_kv", "memory_rec_sum", "memory_vector"),
    "web_search": ("web_search_base", "web_search_no_snippet"),
}
BFCL_V4_HARNESS = "seal.eval.ood (BFCL's FC-runner rules)"
# Questions per BFCL V4 sub-category in BFCL's own files (bfcl-eval's memory and web-search data; prerequisite
# conversations not counted): a full run answers all of them, as the paper's did. tests/report/test_tables.py
# recounts them from BFCL's data (seal.eval.ood's entries).
BFCL_V4_QUESTIONS: Mapping[str, int] = {"memory_kv": 155, "memory_rec_sum": 155, "memory_vector": 155,
                                        "web_search_base": 100, "web_search_no_snippet": 100}


@dataclass(frozen=True)
class CaveatGroup:
    """Rows whose `metrics` were not measured as the paper measured them (why, per row), for one suite."""

    suite: str
    rows: Mapping[Row, Sequence[str]]
    metrics: Sequence[str] | Mapping[Row, Sequence[str]]  # the same columns for every row, or per row

    def covers(self, row: Row, metric: str) -> bool:
        metrics = self.metrics.get(row, ()) if isinstance(self.metrics, Mapping) else self.metrics
        return row in self.rows and metric in metrics
NOT_COMPARABLE = "n/c"


# --- summaries -> estimates ---------------------------------------------------------------------


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
    unknown = sorted(set(accuracy) - allowed - {AVERAGE})
    if unknown:
        raise ValueError(f"summary accuracy keys {unknown} are not among the expected {sorted(allowed)}")
    out: dict[str, Estimate] = {}
    for key, value in accuracy.items():
        if key == AVERAGE:
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
        out[AVERAGE] = mean_estimate([out[c] for c in CATEGORIES])
        given = summary["accuracy"].get(AVERAGE)
        if given is not None and abs(float(given) - out[AVERAGE].value) > 1e-4:
            raise ValueError(
                f"summary average {given} differs from the mean of its category accuracies "
                f"{out[AVERAGE].value:.6f}"
            )
    elif AVERAGE in summary["accuracy"]:
        average = summary["accuracy"][AVERAGE]
        out[AVERAGE] = Estimate(float(average), (summary.get("stderr") or {}).get(AVERAGE))
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


def render_table(spec: TableSpec, ours: Mapping[Row, Mapping[str, Estimate]],
                 caveats: Mapping[Row, Sequence[str]] | None = None,
                 caveat_metrics: Sequence[str] = (),
                 labels: Mapping[Row, str] | None = None,
                 more_caveats: Sequence[CaveatGroup] = ()) -> str:
    """A markdown table: per metric, our estimate, the paper's number and the delta.

    `caveats`: rows whose `caveat_metrics` were not measured as the paper measured them (why, per row): those
    rows are marked ``†``, their Δ in those columns reads ``n/c`` (not comparable), and a footnote says why.
    `labels`: rows whose whole evaluation differs from the column (``held_in_mismatches``), named after the row,
    without deltas. `more_caveats`: further suites' groups, rendered alike (``caveats`` is the τ² group)."""
    groups = [CaveatGroup("τ²", caveats or {}, caveat_metrics), *more_caveats]
    groups = [CaveatGroup(g.suite, {row: list(why) for row, why in g.rows.items() if why}, g.metrics)
              for g in groups]
    caveats = {row: True for g in groups for row in g.rows}
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
        label = (labels or {}).get(row)
        cells = [row_label(row) + (" †" if row in caveats else "") + (f" (not comparable: {label})" if label else "")]
        for metric in spec.metrics:
            estimate = mine.get(metric)
            paper_value = theirs.get(metric)
            apart = estimate is not None and any(g.covers(row, metric) for g in groups)
            cells += [
                format_estimate(estimate),
                format_percent(paper_value),
                # no delta for a row evaluated on other tasks than the paper's column
                NOT_COMPARABLE if apart else format_delta(None if label else delta_points(estimate, paper_value)),
            ]
        lines.append("| " + " | ".join(cells) + " |")
    if caveats:
        lines.append("")
        lines += [f"† {row_label(row)}: {g.suite} not run under the paper's protocol, so not comparable with the "
                  f"paper's column ({'; '.join(why)})." for g in groups for row, why in g.rows.items()]
    return "\n".join(lines) + "\n"


def held_in_spec() -> TableSpec:
    return TableSpec(
        title="BFCL V3 multi-turn (held-in, 400 tasks, 100 per category), success %",
        metrics=HELD_IN_METRICS,
        headers=HELD_IN_HEADERS,
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
        metrics=HELD_IN_METRICS,
        headers=HELD_IN_HEADERS,
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
    rules: str | None = None,
    ood_caveats: Mapping[Row, Sequence[str]] | None = None,
    held_in_labels: Mapping[Row, str] | None = None,
    bfcl_v4_caveats: Mapping[Row, Sequence[str]] | None = None,
) -> str:
    """All requested tables as one markdown document (held-in also lists the reference points).

    ``rules``: the rules profile of the held-in evaluations (``held_in_rules``), named under the title so a
    reader knows whether a figure is BFCL's own number or the training environment's. ``ood_caveats``: rows
    whose τ² numbers differ from the paper's protocol (:func:`tau2_caveats`), labelled in the OOD table.
    ``bfcl_v4_caveats``: rows whose BFCL V4 numbers cover only some of BFCL's sub-categories
    (:func:`bfcl_v4_caveats`). ``held_in_labels``: held-in rows rendered although their evaluation differs from
    the column (``held_in_mismatches``)."""
    unknown = [t for t in tables if t not in TABLES]
    if unknown:
        raise ValueError(f"unknown tables {unknown}; expected some of {TABLES}")
    parts = [
        "## SEAL reproduction vs paper",
        "",
        "Ours: percent ± binomial standard error; paper: as printed; Δ = ours − paper (points).",
        "",
    ]
    if rules is not None and held_in:
        parts += [f"Held-in evaluation rules: {DESCRIPTIONS[rules]} (docs/evaluation.md).", ""]
    if "held_in" in tables:
        parts += [render_table(held_in_spec(), held_in, labels=held_in_labels), render_reference_points()]
    if "ood" in tables:
        # a partial key's column and the BFCL V4 average over it (each reason begins with its key)
        partial = {row: [pn.BFCL_V4_AVERAGE, *(why.split(":", 1)[0] for why in reasons)]
                   for row, reasons in (bfcl_v4_caveats or {}).items()}
        v4 = CaveatGroup("BFCL V4", bfcl_v4_caveats or {}, partial)
        parts.append(render_table(ood_spec(), ood, ood_caveats, TAU2_METRICS, more_caveats=[v4]))
        harness = bfcl_v4_harness_note(ood)
        if harness:
            parts.append(harness + "\n")
    if "ablation" in tables:
        parts.append(render_table(ablation_spec(), held_in, labels=held_in_labels))
    return "\n".join(parts)


# --- reading evaluation directories into table estimates ------------------------------------


def held_in_mismatch(summary: Mapping[str, Any]) -> str | None:
    """How an evaluation differs from the held-in column (the eval split's 400 tasks, 100 per category), or
    None. A summary without ``split`` or ``count`` is judged on what it has."""
    problems = []
    split = summary.get("split")
    if split is not None and split != pn.HELD_IN_SPLIT:
        problems.append(f"split {split!r}, not {pn.HELD_IN_SPLIT!r}")
    counts = summary.get("count")
    if isinstance(counts, Mapping) and dict(counts) != {c: pn.HELD_IN_PER_CATEGORY for c in CATEGORIES}:
        per = ", ".join(f"{c.removeprefix('multi_turn_')} {n}" for c, n in counts.items())
        problems.append(f"{sum(counts.values())} tasks ({per}), not {pn.HELD_IN_PER_CATEGORY} per category")
    return "; ".join(problems) or None


def held_in_mismatches(mapping: Mapping[str, str | Path]) -> dict[Row, str]:
    """Held-in rows whose evaluation differs from the column, with how (``held_in_mismatch``)."""
    found = {pn.parse_row(key): held_in_mismatch(read_summary(directory)) for key, directory in mapping.items()}
    return {row: what for row, what in found.items() if what}


def load_held_in(mapping: Mapping[str, str | Path], allow_mismatched: bool = False) -> dict[Row, dict[str, Estimate]]:
    """Row key -> evaluation directory, read into table estimates (errors name the offending row).

    A row evaluated on other tasks than the column's (another split, a task subset) is refused unless
    `allow_mismatched` (then render it with ``held_in_mismatches`` as its label)."""
    out: dict[Row, dict[str, Estimate]] = {}
    for key, directory in mapping.items():
        row = pn.parse_row(key)
        if row in out:
            raise ValueError(f"row {row.key} is given twice")
        try:
            summary = read_summary(directory)
            out[row] = held_in_estimates(summary)
        except (OSError, ValueError) as exc:
            raise ValueError(f"row {row.key} ({directory}): {exc}") from None
        what = held_in_mismatch(summary)
        if what and not allow_mismatched:
            raise ValueError(f"row {row.key} ({directory}) is not the held-in column's evaluation: {what}. The "
                             "paper's numbers are on the eval split's 400 tasks; evaluate with --split eval, or "
                             "pass --allow-mismatched to render it labelled, without deltas")
    return out


def held_in_rules(mapping: Mapping[str, str | Path]) -> str | None:
    """The one rules profile of the held-in evaluation directories (None if there are none).

    Rows evaluated under different profiles are refused: their numbers are not comparable. A summary
    without ``rules`` predates the profiles and was played under the release's rules."""
    found = {key: read_summary(directory).get("rules") or RELEASE for key, directory in mapping.items()}
    profiles = sorted(set(found.values()))
    if len(profiles) > 1:
        listing = ", ".join(f"{key}: {rules}" for key, rules in found.items())
        raise ValueError(f"held-in rows were evaluated under different rules profiles ({listing})")
    return profiles[0] if profiles else None


def tau2_differences(summary: Mapping[str, Any]) -> list[str] | None:
    """How an OOD summary's τ² run differs from the paper's protocol; None when it holds no τ² domain."""
    accuracy = summary.get("accuracy") or {}
    if not any(part in accuracy for part in pn.OOD_SUITES[pn.TAU2_AVERAGE]):
        return None
    return protocol_differences(summary.get("tau2"))


def bfcl_v4_differences(summary: Mapping[str, Any]) -> list[str]:
    """How an OOD summary's BFCL V4 numbers differ from the paper's: a key that averages only some of BFCL's
    sub-categories (``breakdown``), e.g. memory from a subset of its backends, or a sub-category with other than
    BFCL's number of questions (``BFCL_V4_QUESTIONS``: a ``--tasks`` subset, or no count recorded), as the
    held-in and τ² rows check their task counts. Each reason begins with its key. Empty when complete or absent."""
    accuracy = summary.get("accuracy") or {}
    breakdown = summary.get("breakdown") or {}
    out = []
    for key, parts in BFCL_V4_PARTS.items():
        if key not in accuracy:
            continue
        if not set(parts) <= set(breakdown):
            have = [p for p in parts if p in breakdown]
            out.append(f"{key}: the mean of {', '.join(have) or 'no recorded sub-category'} only, "
                       f"not of {', '.join(parts)} (harness {BFCL_V4_HARNESS})")
        counts = {p: (breakdown[p] or {}).get("count") for p in parts if p in breakdown}
        off = {p: n for p, n in counts.items() if n != BFCL_V4_QUESTIONS[p]}
        if off:
            what = ", ".join(f"{p} {'no count recorded' if n is None else f'{n} questions'} (BFCL: "
                             f"{BFCL_V4_QUESTIONS[p]})" for p, n in off.items())
            out.append(f"{key}: a task subset: {what} (harness {BFCL_V4_HARNESS})")
    return out


def bfcl_v4_harness_note(ood: Mapping[Row, Mapping[str, Estimate]]) -> str | None:
    """The line under the OOD table naming the BFCL V4 harness of every row with a BFCL V4 number."""
    rows = [row_label(row) for row, metrics in ood.items()
            if any(k in metrics for k in (pn.BFCL_V4_AVERAGE, *BFCL_V4_PARTS))]
    if not rows:
        return None
    return (f"BFCL V4 harness of {', '.join(rows)}: {BFCL_V4_HARNESS}; every sub-category complete "
            f"({', '.join(f'{p} {n}' for p, n in BFCL_V4_QUESTIONS.items())} questions) unless marked †.")


def _row_caveats(mapping: Mapping[str, Sequence[str | Path]],
                 differences_of: Callable[[Mapping[str, Any]], list[str] | None]) -> dict[Row, list[str]]:
    """Row -> what `differences_of` finds in the summaries of its directories (rows with none are left out)."""
    out: dict[Row, list[str]] = {}
    for key, directories in mapping.items():
        for directory in directories:
            differences = differences_of(read_summary(directory))
            if differences:
                out.setdefault(pn.parse_row(key), []).extend(differences)
    return out


def bfcl_v4_caveats(mapping: Mapping[str, Sequence[str | Path]]) -> dict[Row, list[str]]:
    """Row -> how its BFCL V4 numbers differ from the paper's, for rows with partial BFCL V4 keys."""
    return _row_caveats(mapping, bfcl_v4_differences)


def tau2_caveats(mapping: Mapping[str, Sequence[str | Path]]) -> dict[Row, list[str]]:
    """Row -> what differs from the paper's τ² protocol, for rows whose τ² run differs."""
    return _row_caveats(mapping, tau2_differences)


def load_ood(mapping: Mapping[str, Sequence[str | Path]],
             allow_noncomparable_tau2: bool = False,
             allow_partial_bfcl_v4: bool = False) -> dict[Row, dict[str, Estimate]]:
    """Row key -> OOD evaluation directories (e.g. a BFCL V4 and a τ² one), read into table estimates.

    A τ² run whose code, task set, split, trials, seed or user simulator differ from the paper's protocol is
    refused unless `allow_noncomparable_tau2` (then render with :func:`tau2_caveats`, which labels it); a BFCL V4
    key averaging only some of BFCL's sub-categories (e.g. memory from one backend) unless
    `allow_partial_bfcl_v4` (then render with :func:`bfcl_v4_caveats`)."""
    out: dict[Row, dict[str, Estimate]] = {}
    for key, directories in mapping.items():
        row = pn.parse_row(key)
        if row in out:
            raise ValueError(f"row {row.key} is given twice")
        try:
            summaries = [read_summary(d) for d in directories]
            for summary in summaries:
                differences = tau2_differences(summary)
                if differences and not allow_noncomparable_tau2:
                    raise ValueError("its τ² run is not comparable with the paper's (" + "; ".join(differences)
                                     + "); pass --allow-noncomparable-tau2 to show it labelled")
                partial = bfcl_v4_differences(summary)
                if partial and not allow_partial_bfcl_v4:
                    raise ValueError("its BFCL V4 numbers are not comparable with the paper's ("
                                     + "; ".join(partial) + "); pass --allow-partial-bfcl-v4 to show them labelled")
            out[row] = ood_estimates(summaries)
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

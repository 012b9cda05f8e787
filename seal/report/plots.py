"""Figure 3 (validation accuracy per category vs step) and the failure-profile plot, from ``metrics.jsonl``.

Series extraction is pure (:func:`validation_curve`, :func:`tag_share_series`); drawing uses
matplotlib's object API with the Agg canvas (no pyplot, no global backend switch), so importing this
module never changes another module's plotting state. Images have a fixed pixel size,
``figsize × dpi``, because nothing is cropped (no ``bbox_inches="tight"``).

Metric keys follow ``docs/run_directory.md``: ``val/accuracy/<category>``, ``val/count/<category>``,
``val/accuracy/average`` and ``train/tag_frac/<tag>``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from matplotlib import colormaps
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.patches import Patch
from matplotlib.ticker import MaxNLocator

from env_service.vocab import CATEGORIES, PAPER_LABELS, PROGRESS_TAGS
from seal.eval.results import AVERAGE, HELD_IN_HEADERS, read_jsonl
from seal.eval.stats import binomial_stderr
from seal.run_dir import METRICS_FILE

# The figure's panels: the four categories, then their average.
PANEL_TITLES: Mapping[str, str] = {metric: HELD_IN_HEADERS[metric] for metric in (*CATEGORIES, AVERAGE)}
TAG_FRAC_PREFIX = "train/tag_frac/"
TRAIN_REWARD = "train/reward_mean"
TRAIN_REWARD_TITLE = "Training reward (mean)"


@dataclass(frozen=True)
class Curve:
    """A validation series: ``values`` (fractions) and ``stderr`` (None where the count is unknown) per step."""

    steps: tuple[int, ...]
    values: tuple[float, ...]
    stderr: tuple[float | None, ...]


def read_metrics(path: str | Path) -> list[dict[str, Any]]:
    """Lines of a ``metrics.jsonl`` (a file, or a run directory holding one); each must carry an int ``step``."""
    path = Path(path)
    if path.is_dir():
        path = path / METRICS_FILE
    records = read_jsonl(path)
    for number, record in enumerate(records, 1):
        step = record.get("step")
        if not isinstance(step, int) or isinstance(step, bool) or step < 0:
            raise ValueError(f"{path}: record {number}: every line needs a non-negative integer 'step'")
    return records


def _stderr(p: float, n: Any) -> float | None:
    """Binomial error when the count is known (a positive number), else None."""
    if not isinstance(n, (int, float)) or isinstance(n, bool) or n <= 0:
        return None
    return binomial_stderr(min(max(p, 0.0), 1.0), n)


def validation_curve(records: Sequence[Mapping[str, Any]], metric: str) -> Curve:
    """The validation series of a category (or ``average``), sorted by step; a later line for the same
    step (a resumed run) replaces an earlier one.

    Category errors are binomial, sqrt(p (1 - p) / n) with n = ``val/count/<category>``; the average's is
    sqrt(Σ se_c²) / 4 when all four categories and counts are on that line. The average falls back to
    the mean of the four category accuracies when ``val/accuracy/average`` is absent.
    """
    if metric != AVERAGE and metric not in CATEGORIES:
        raise ValueError(f"unknown validation metric {metric!r}; expected 'average' or one of {CATEGORIES}")
    points: dict[int, tuple[float, float | None]] = {}
    for record in records:
        categories = {c: record.get(f"val/accuracy/{c}") for c in CATEGORIES}
        errors = {
            c: None if v is None else _stderr(float(v), record.get(f"val/count/{c}"))
            for c, v in categories.items()
        }
        if metric == AVERAGE:
            value = record.get("val/accuracy/average")
            complete = all(v is not None for v in categories.values())
            if value is None and complete:
                value = sum(float(v) for v in categories.values()) / len(CATEGORIES)
            if value is None:
                continue
            known = [e for e in errors.values() if e is not None]
            error = (
                math.sqrt(sum(e * e for e in known)) / len(CATEGORIES)
                if complete and len(known) == len(CATEGORIES)
                else None
            )
        else:
            value = categories[metric]
            if value is None:
                continue
            error = errors[metric]
        value = float(value)
        if not 0.0 <= value <= 1.0:
            raise ValueError(f"step {record['step']}: {metric} accuracy {value} is not a fraction in [0, 1]")
        points[int(record["step"])] = (value, error)
    steps = tuple(sorted(points))
    return Curve(steps, tuple(points[s][0] for s in steps), tuple(points[s][1] for s in steps))


def training_curve(records: Sequence[Mapping[str, Any]], key: str = TRAIN_REWARD) -> Curve:
    """A training series (e.g. the mean reward per step; on a short run the signal that moves), sorted by step;
    a later line for the same step (a resumed run) replaces an earlier one. No error band."""
    points = {int(r["step"]): float(r[key]) for r in records if isinstance(r.get(key), (int, float))}
    steps = tuple(sorted(points))
    return Curve(steps, tuple(points[s] for s in steps), tuple(None for _ in steps))


def tag_order(tags: set[str] | frozenset[str]) -> list[str]:
    """Tags in vocabulary order (progress tags, then paper labels), unknown tags last, sorted."""
    known = [t for t in (*PROGRESS_TAGS, *PAPER_LABELS) if t in tags]
    known = list(dict.fromkeys(known))  # "pass" etc. appear in both vocabularies
    return known + sorted(tags - set(known))


def tag_share_series(
    records: Sequence[Mapping[str, Any]],
) -> tuple[tuple[int, ...], dict[str, tuple[float, ...]]]:
    """Training steps that report ``train/tag_frac/<tag>`` and, per tag (ordered by :func:`tag_order`),
    its share at each of those steps (0 where a step does not mention the tag). Later lines for the
    same step replace earlier ones."""
    by_step: dict[int, dict[str, float]] = {}
    for record in records:
        shares = {
            k[len(TAG_FRAC_PREFIX) :]: float(v) for k, v in record.items() if k.startswith(TAG_FRAC_PREFIX)
        }
        if shares:
            bad = {t: s for t, s in shares.items() if not 0.0 <= s <= 1.0}
            if bad:
                raise ValueError(f"step {record['step']}: tag shares {bad} are not fractions in [0, 1]")
            by_step[int(record["step"])] = shares
    steps = tuple(sorted(by_step))
    tags = tag_order(frozenset(t for shares in by_step.values() for t in shares))
    return steps, {tag: tuple(by_step[s].get(tag, 0.0) for s in steps) for tag in tags}


# --- drawing ------------------------------------------------------------------------------------


def _save(figure: Figure, path: str | Path, dpi: int) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    FigureCanvasAgg(figure)
    figure.savefig(path, dpi=dpi, format="png")
    return path


def _floor_ylim(ax: Any, floor: float) -> None:
    """Keep the y-axis from dipping below `floor` (all-zero series would otherwise show -0.05 ... 0.05)."""
    low, high = ax.get_ylim()
    if low < floor:
        ax.set_ylim(floor, max(high, floor + 1.0))


def figure3(
    runs: Mapping[str, Sequence[Mapping[str, Any]]],
    *,
    size_in: tuple[float, float] = (15.0, 8.0),
    title: str = "Validation accuracy per category (shaded: ± binomial standard error) and training reward",
) -> Figure:
    """Figure 3 as a matplotlib figure: a panel per category, the average, and the training reward; one line
    per run. A run with neither validation lines nor training rewards is an error."""
    if not runs:
        raise ValueError("no runs to plot")
    curves = {
        label: {m: validation_curve(records, m) for m in PANEL_TITLES} for label, records in runs.items()
    }
    rewards = {label: training_curve(records) for label, records in runs.items()}
    empty = [label for label, by_metric in curves.items()
             if not any(c.steps for c in by_metric.values()) and not rewards[label].steps]
    if empty:
        raise ValueError(f"runs without validation metrics (val/accuracy/*) or {TRAIN_REWARD}: {empty}")
    figure = Figure(figsize=size_in)
    axes = figure.subplots(2, 3).ravel()
    for ax, metric in zip(axes, PANEL_TITLES, strict=False):
        for index, (label, by_metric) in enumerate(curves.items()):
            curve = by_metric[metric]
            if not curve.steps:
                continue
            color = f"C{index % 10}"
            values = [100.0 * v for v in curve.values]
            ax.plot(curve.steps, values, marker="o", markersize=3, color=color, label=label)
            band = [
                (s, v, e) for s, v, e in zip(curve.steps, values, curve.stderr, strict=True) if e is not None
            ]
            if band:
                steps = [s for s, _, _ in band]
                low = [max(0.0, v - 100.0 * e) for _, v, e in band]
                high = [v + 100.0 * e for _, v, e in band]
                ax.fill_between(steps, low, high, color=color, alpha=0.2, linewidth=0)
        ax.set_title(PANEL_TITLES[metric])
        ax.set_ylabel("success (%)")
        _floor_ylim(ax, 0.0)
    reward_ax = axes[len(PANEL_TITLES)]
    for index, (label, curve) in enumerate(rewards.items()):
        if curve.steps:
            reward_ax.plot(curve.steps, curve.values, marker="o", markersize=3, color=f"C{index % 10}", label=label)
    reward_ax.set_title(TRAIN_REWARD_TITLE)
    reward_ax.set_ylabel("reward")
    lowest = min((v for c in rewards.values() for v in c.values), default=0.0)
    _floor_ylim(reward_ax, min(0.0, lowest))
    for ax in axes:
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_xlabel("training step")
        ax.grid(True, alpha=0.3)
    # Every run has some series, but not necessarily in the first panel: merge all panels.
    legend: dict[str, Any] = {}
    for ax in axes:
        for handle, label in zip(*ax.get_legend_handles_labels(), strict=True):
            legend.setdefault(label, handle)
    figure.legend(list(legend.values()), list(legend), loc="lower center", ncol=max(1, len(legend)))
    figure.suptitle(title)
    figure.subplots_adjust(hspace=0.4, wspace=0.3, bottom=0.14)
    return figure


def plot_validation_curves(
    runs: Mapping[str, Sequence[Mapping[str, Any]]],
    path: str | Path,
    *,
    size_in: tuple[float, float] = (15.0, 8.0),
    dpi: int = 100,
) -> Path:
    """Figure 3 (``figure3``) written as a PNG of ``size_in × dpi`` pixels; returns its path.

    ``runs`` maps a legend label (e.g. SEAL, Vanilla RL) to that run's ``metrics.jsonl`` records."""
    return _save(figure3(runs, size_in=size_in), path, dpi)


def plot_failure_profile(
    runs: Mapping[str, Sequence[Mapping[str, Any]]],
    path: str | Path,
    *,
    panel_size_in: tuple[float, float] = (7.0, 4.5),
    dpi: int = 100,
) -> Path:
    """Stacked-area failure profile: share of each turn tag (``train/tag_frac/<tag>``) per training step,
    one panel per run that logs tag shares, side by side; a tag keeps its colour across panels.

    The image is ``(panel width × panels + legend column) × dpi`` wide, where the legend column is half
    a panel. Raises ``ValueError`` when no run logs tag shares (e.g. Vanilla RL, with diagnosis off).
    """
    series = {label: tag_share_series(records) for label, records in runs.items()}
    series = {label: s for label, s in series.items() if s[0]}
    if not series:
        raise ValueError("no run logs train/tag_frac/<tag>: nothing to plot")
    all_tags = tag_order(frozenset(t for _, shares in series.values() for t in shares))
    colors = {tag: (f"C{i}" if len(all_tags) <= 10 else _tab20(i)) for i, tag in enumerate(all_tags)}
    width, height = panel_size_in
    figure = Figure(figsize=(width * (len(series) + 0.5), height))
    grid = figure.add_gridspec(1, len(series) + 1, width_ratios=[1.0] * len(series) + [0.5])
    for column, (label, (steps, shares)) in enumerate(series.items()):
        ax = figure.add_subplot(grid[0, column])
        tags = list(shares)
        ax.stackplot(
            steps, [shares[t] for t in tags], labels=tags, colors=[colors[t] for t in tags], alpha=0.85
        )
        ax.set_title(label)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_xlabel("training step")
        ax.set_ylabel("share of turn tags")
        ax.set_ylim(0.0, max(1.0, max(sum(values) for values in zip(*shares.values(), strict=True))))
        ax.set_xlim(steps[0], steps[-1] if len(steps) > 1 else steps[0] + 1)
    legend_ax = figure.add_subplot(grid[0, len(series)])
    legend_ax.axis("off")
    # Listed top-down in the order the areas stack (the first tag is the bottom layer).
    legend_tags = all_tags[::-1]
    legend_ax.legend(
        [Patch(color=colors[t]) for t in legend_tags], legend_tags, loc="center left", fontsize="small"
    )
    figure.suptitle("Failure profile: turn-tag shares of the training rollouts")
    figure.subplots_adjust(top=0.85, bottom=0.15)
    return _save(figure, path, dpi)


def _tab20(index: int) -> tuple[float, float, float, float]:
    return colormaps["tab20"](index % 20)

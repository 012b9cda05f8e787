"""The statistics every number in this project's evaluations and reports is printed with.

A success rate is an :class:`Estimate`: a fraction in [0, 1] with its standard error. A rate over ``n``
graded tasks carries the binomial error sqrt(p (1 - p) / n); an unweighted mean of k independent rates (the
held-in average of the four categories, an OOD suite's average of its parts) carries sqrt(Σ se²) / k
(``docs/run_directory.md``), and prints as ``37.00 ± 4.83`` (percent) through :func:`format_estimate`. Pure
functions; evaluation (``seal.eval.results``, ``seal.eval.evaluate``) and the report modules (``seal.report.tables``,
``seal.report.plots``, ``seal.report.failure_report``) share them. They live beside the evaluation because the
evaluation is what produces these numbers; the report only reads them (reporting imports evaluation, never the
reverse: ``docs/layout.md``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

MISSING = "–"  # what a table cell prints where there is no number


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


def format_estimate(estimate: Estimate | None) -> str:
    """``37.00 ± 4.83`` (percent), ``37.00`` without a standard error, ``–`` without data."""
    if estimate is None:
        return MISSING
    text = f"{100.0 * estimate.value:.2f}"
    if estimate.stderr is not None:
        text += f" ± {100.0 * estimate.stderr:.2f}"
    return text

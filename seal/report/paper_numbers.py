"""The paper's reported numbers (arXiv 2605.24426), transcribed once, as typed constants.

Source: the paper's results tables. Every value is a success rate in percent, as
printed in the paper. Table code (``seal.report.tables``) reads these; nothing else should restate them.

Rows are identified by :class:`Row` = (backbone, training). Metric keys are the keys our evaluation
summaries use (``docs/run_directory.md``): ``average`` and the four BFCL category names for the held-in
table; the OOD keys in :data:`OOD_METRICS` for the out-of-distribution table.

Known inconsistency in the paper: the OOD table prints 5.98 as the BFCL V4 average of
Qwen2.5-3B-Instruct + Vanilla RL, but its two parts (0.50 and 11.26) average to 5.88. The value is kept
as printed; :data:`KNOWN_INCONSISTENT_AVERAGES` records it so the transcription check can tell a typo in
the paper from a typo here.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

from seal.eval.results import HELD_IN_METRICS

# --- row identity -------------------------------------------------------------------------------

QWEN_3B = "Qwen2.5-3B-Instruct"
QWEN_7B = "Qwen2.5-7B-Instruct"
TOOLACE_8B = "ToolACE-2-Llama-3.1-8B"
BACKBONES: tuple[str, ...] = (QWEN_3B, QWEN_7B, TOOLACE_8B)

BASE = "base"
VANILLA_RL = "vanilla_rl"
SEAL = "seal"
WO_ENV_ADAPTATION = "wo_env_adaptation"
WO_REWEIGHTING = "wo_reweighting"
WO_CLOSED_LOOP = "wo_closed_loop"

# Training variant -> the label the paper prints ("" for the untrained backbone).
TRAINING_LABELS: Mapping[str, str] = MappingProxyType(
    {
        BASE: "",
        VANILLA_RL: "Vanilla RL",
        SEAL: "SEAL",
        WO_ENV_ADAPTATION: "w/o environment-side adaptation",
        WO_REWEIGHTING: "w/o diagnosis-guided reweighting",
        WO_CLOSED_LOOP: "w/o closed-loop update",
    }
)

# Short spellings accepted on the command line (compared after lower-casing and dropping every
# character that is not a letter or digit).
_BACKBONE_ALIASES: Mapping[str, str] = MappingProxyType(
    {
        "qwen253binstruct": QWEN_3B,
        "qwen253b": QWEN_3B,
        "qwen3b": QWEN_3B,
        "qwen257binstruct": QWEN_7B,
        "qwen257b": QWEN_7B,
        "qwen7b": QWEN_7B,
        "toolace2llama318b": TOOLACE_8B,
        "toolace28b": TOOLACE_8B,
        "toolace8b": TOOLACE_8B,
    }
)
_TRAINING_ALIASES: Mapping[str, str] = MappingProxyType(
    {
        "": BASE,
        "base": BASE,
        "vanillarl": VANILLA_RL,
        "vanilla": VANILLA_RL,
        "seal": SEAL,
        "fullseal": SEAL,
        "woenvadaptation": WO_ENV_ADAPTATION,
        "woenvironmentsideadaptation": WO_ENV_ADAPTATION,
        "woreweighting": WO_REWEIGHTING,
        "wodiagnosisguidedreweighting": WO_REWEIGHTING,
        "woclosedloop": WO_CLOSED_LOOP,
        "woclosedloopupdate": WO_CLOSED_LOOP,
    }
)


def _squash(text: str) -> str:
    return re.sub(r"[^a-z0-9]", "", text.lower())


@dataclass(frozen=True, order=True)
class Row:
    """One table row: a backbone and how it was trained (one of :data:`TRAINING_LABELS`)."""

    backbone: str
    training: str = BASE

    def __post_init__(self) -> None:
        if self.backbone not in BACKBONES:
            raise ValueError(f"unknown backbone {self.backbone!r}; expected one of {BACKBONES}")
        if self.training not in TRAINING_LABELS:
            raise ValueError(f"unknown training {self.training!r}; expected one of {tuple(TRAINING_LABELS)}")

    @property
    def key(self) -> str:
        """Canonical command-line key, e.g. ``Qwen2.5-7B-Instruct+SEAL`` (the base row is the backbone)."""
        label = TRAINING_LABELS[self.training]
        return f"{self.backbone}+{label}" if label else self.backbone

    @property
    def label(self) -> str:
        """How the paper prints the row: the backbone, or ``+ <training>`` under it."""
        label = TRAINING_LABELS[self.training]
        return f"+ {label}" if label else self.backbone


def parse_row(key: str) -> Row:
    """Parse a row key such as ``Qwen2.5-7B-Instruct+SEAL``, ``qwen7b+vanilla_rl`` or ``ToolACE-2-8B``.

    The part before the first ``+`` names the backbone, the rest the training variant; both are matched
    case-insensitively, ignoring punctuation and spaces. Raises ``ValueError`` with the valid choices.
    """
    backbone_text, _, training_text = key.partition("+")
    backbone = _BACKBONE_ALIASES.get(_squash(backbone_text))
    if backbone is None:
        raise ValueError(
            f"row {key!r}: unknown backbone {backbone_text.strip()!r}; expected one of {BACKBONES}"
        )
    training = _TRAINING_ALIASES.get(_squash(training_text))
    if training is None:
        choices = ", ".join(label or "(none: base model)" for label in TRAINING_LABELS.values())
        raise ValueError(
            f"row {key!r}: unknown training {training_text.strip()!r}; expected one of {choices}"
        )
    return Row(backbone, training)


# --- metric keys --------------------------------------------------------------------------------

# The held-in keys (``average`` and the four categories, :data:`HELD_IN_METRICS`) are our evaluation
# summaries' keys, defined with them in ``seal.eval.results``.

# OOD sub-benchmarks, grouped by suite; a suite's average is the unweighted mean of its parts (this
# reproduces the paper's averages, e.g. τ² 7B base (16.67 + 20.00 + 11.67) / 3 = 16.11).
BFCL_V4_AVERAGE = "bfcl_v4_average"
TAU2_AVERAGE = "tau2_average"
OOD_SUITES: Mapping[str, tuple[str, ...]] = MappingProxyType(
    {
        BFCL_V4_AVERAGE: ("web_search", "memory"),
        TAU2_AVERAGE: ("retail", "airline", "telecom"),
    }
)
OOD_METRICS: tuple[str, ...] = (
    BFCL_V4_AVERAGE,
    "web_search",
    "memory",
    TAU2_AVERAGE,
    "retail",
    "airline",
    "telecom",
)
OOD_HEADERS: Mapping[str, str] = MappingProxyType(
    {
        BFCL_V4_AVERAGE: "BFCL V4 Avg",
        "web_search": "Web Search",
        "memory": "Memory",
        TAU2_AVERAGE: "τ² Avg",
        "retail": "Retail",
        "airline": "Airline",
        "telecom": "Telecom",
    }
)


# --- the numbers --------------------------------------------------------------------------------


# What the held-in column is: the 400 eval-split tasks, 100 per BFCL V3 category.
HELD_IN_SPLIT = "eval"
HELD_IN_PER_CATEGORY = 100


@dataclass(frozen=True)
class HeldInScores:
    """A BFCL V3 multi-turn row (percent; 400 held-in tasks, 100 per category)."""

    average: float
    base: float
    miss_func: float
    miss_param: float
    long_context: float

    def as_metrics(self) -> dict[str, float]:
        """Keyed by :data:`HELD_IN_METRICS`."""
        values = (self.average, self.base, self.miss_func, self.miss_param, self.long_context)
        return dict(zip(HELD_IN_METRICS, values, strict=True))


@dataclass(frozen=True)
class OodScores:
    """An out-of-distribution row (percent): BFCL V4 Web Search / Memory and τ²-bench domains."""

    bfcl_v4_average: float
    web_search: float
    memory: float
    tau2_average: float
    retail: float
    airline: float
    telecom: float

    def as_metrics(self) -> dict[str, float]:
        """Keyed by :data:`OOD_METRICS`."""
        values = (
            self.bfcl_v4_average,
            self.web_search,
            self.memory,
            self.tau2_average,
            self.retail,
            self.airline,
            self.telecom,
        )
        return dict(zip(OOD_METRICS, values, strict=True))


# Paper main table (BFCL V3 multi-turn, held-in), in the paper's row order.
HELD_IN: Mapping[Row, HeldInScores] = MappingProxyType(
    {
        Row(QWEN_3B, BASE): HeldInScores(5.75, 11.00, 6.00, 3.00, 3.00),
        Row(QWEN_3B, VANILLA_RL): HeldInScores(9.25, 16.00, 9.00, 6.00, 6.00),
        Row(QWEN_3B, SEAL): HeldInScores(14.00, 19.00, 15.00, 12.00, 10.00),
        Row(QWEN_7B, BASE): HeldInScores(14.00, 22.00, 14.00, 10.00, 10.00),
        Row(QWEN_7B, VANILLA_RL): HeldInScores(30.75, 46.00, 27.00, 27.00, 23.00),
        Row(QWEN_7B, SEAL): HeldInScores(40.25, 58.00, 36.00, 34.00, 33.00),
        Row(TOOLACE_8B, BASE): HeldInScores(32.00, 45.00, 26.00, 35.00, 22.00),
        Row(TOOLACE_8B, VANILLA_RL): HeldInScores(38.50, 52.00, 30.00, 40.00, 32.00),
        Row(TOOLACE_8B, SEAL): HeldInScores(46.75, 58.00, 46.00, 44.00, 39.00),
    }
)

# Paper OOD table; the paper reports no OOD numbers for ToolACE-2-Llama-3.1-8B.
OOD: Mapping[Row, OodScores] = MappingProxyType(
    {
        Row(QWEN_3B, BASE): OodScores(4.69, 0.00, 9.38, 9.64, 5.26, 14.00, 9.65),
        Row(QWEN_3B, VANILLA_RL): OodScores(5.98, 0.50, 11.26, 10.60, 6.14, 16.00, 9.65),
        Row(QWEN_3B, SEAL): OodScores(8.63, 2.00, 15.26, 11.76, 8.77, 16.00, 10.52),
        Row(QWEN_7B, BASE): OodScores(9.17, 6.50, 11.83, 16.11, 16.67, 20.00, 11.67),
        Row(QWEN_7B, VANILLA_RL): OodScores(10.26, 7.50, 13.02, 17.19, 19.30, 20.00, 12.28),
        Row(QWEN_7B, SEAL): OodScores(12.71, 9.50, 15.92, 20.79, 26.32, 22.00, 14.04),
    }
)

# (row, metric) pairs whose printed average disagrees with the mean of its printed parts.
KNOWN_INCONSISTENT_AVERAGES: frozenset[tuple[Row, str]] = frozenset(
    {(Row(QWEN_3B, VANILLA_RL), BFCL_V4_AVERAGE)}
)

# Ablation table (Qwen2.5-7B-Instruct). Its Vanilla RL and full-SEAL rows are the main table's rows.
ABLATION: Mapping[Row, HeldInScores] = MappingProxyType(
    {
        Row(QWEN_7B, VANILLA_RL): HELD_IN[Row(QWEN_7B, VANILLA_RL)],
        Row(QWEN_7B, WO_ENV_ADAPTATION): HeldInScores(35.75, 52.00, 31.00, 32.00, 28.00),
        Row(QWEN_7B, WO_REWEIGHTING): HeldInScores(32.75, 48.00, 27.00, 31.00, 25.00),
        Row(QWEN_7B, WO_CLOSED_LOOP): HeldInScores(33.00, 46.00, 32.00, 28.00, 26.00),
        Row(QWEN_7B, SEAL): HELD_IN[Row(QWEN_7B, SEAL)],
    }
)

# Reference points (not controlled): average success on the same 400 held-in tasks.
REFERENCE_POINTS: Mapping[str, float] = MappingProxyType(
    {
        "GLM-4.6": 68.00,
        "Claude-Sonnet-4.5": 61.38,
        "Gemini-3-Pro-Preview": 60.75,
        "xLAM-2-3b-fc-r": 58.38,
    }
)

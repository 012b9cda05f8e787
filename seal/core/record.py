"""`EpisodeRecord`: what the SEAL method reads of one finished episode, in one typed form for both engines.

Every consumer in `seal.core` takes these records and nothing else: the capability state and the
controller's `observe` (C_t), `validation_metrics`, and the A-Patch columns (`record_columns`). The
episode driver's result is turned into a record in one place, `seal.rollout.types.Rollout.record()`;
the verl engine carries it across Ray and TransferQueue in the agent loop's extras as the plain mapping
`to_dict()` makes and reads it back with `from_dict()` (the two are each other's inverse).

Fields::

    task_id        BFCL task id, e.g. "multi_turn_base_12"
    category       BFCL category ("base", "miss_func", ...); "" = derived from task_id
    failure_tags   the release's progress tags, one per user turn (env service `failure_tags`)
    paper_labels   the paper's labels, one per user turn (env service `paper_labels`)
    reward         the training reward (seal.reward; the paper: the 0/1 verdict)
    accuracy       BFCL's official verdict 0.0 / 1.0; None when the episode was never graded
    excluded       not trained on and not scored
    exclude_reason why ("infrastructure", "prompt_too_long", "env_rejected:<code>", ...; seal.rollout.types)
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, fields
from typing import Any

import numpy as np

from env_service.vocab import category_of
from seal.core.weights import reply_field

# The non_tensor_batch columns `record_columns` builds (A-Patch reads the tag columns; logs the rest).
RECORD_COLUMNS = ("task_id", "category", "failure_tags", "paper_labels", "excluded")


@dataclass(frozen=True)
class EpisodeRecord:
    """One finished (or excluded) episode as the SEAL method sees it (fields: module docstring)."""

    task_id: str
    category: str = ""
    failure_tags: tuple[str, ...] = ()
    paper_labels: tuple[str, ...] = ()
    reward: float = 0.0
    accuracy: float | None = None
    excluded: bool = False
    exclude_reason: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.task_id, str):
            raise TypeError(f"task_id must be a string, got {type(self.task_id).__name__}")
        for name in ("failure_tags", "paper_labels"):
            tags = getattr(self, name)
            # A bare string is almost always a tag list serialised by mistake; refuse it rather than split it.
            if isinstance(tags, (str, bytes)) or not all(isinstance(t, str) for t in tags):
                raise TypeError(f"task {self.task_id}: {name} must be a list of strings, got {tags!r}")
            object.__setattr__(self, name, tuple(tags))
        object.__setattr__(self, "reward", float(self.reward))
        if not math.isfinite(self.reward):
            raise ValueError(f"task {self.task_id}: reward must be finite, got {self.reward}")
        if self.accuracy is not None:
            object.__setattr__(self, "accuracy", float(self.accuracy))
        object.__setattr__(self, "excluded", bool(self.excluded))
        if not self.category:
            object.__setattr__(self, "category", category_of(self.task_id) if self.task_id else "")

    def tags(self, vocabulary: str) -> tuple[str, ...]:
        """The per-turn tags of `vocabulary` ("progress": `failure_tags`, "paper": `paper_labels`)."""
        return getattr(self, reply_field(vocabulary))

    @property
    def success(self) -> bool:
        """The official verdict when graded, else the reward reaching 1."""
        return self.accuracy >= 1.0 if self.accuracy is not None else self.reward >= 1.0

    # ------------------------------------------------------------------ wire form (verl's extras)
    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-able mapping (lists for tags); `from_dict` reads it back."""
        out = asdict(self)
        out["failure_tags"], out["paper_labels"] = list(self.failure_tags), list(self.paper_labels)
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> EpisodeRecord:
        """The inverse of `to_dict`. Keys outside the record are ignored (the extras carry logs too);
        None stands for a field's default, so an ungraded episode's `reward: None` reads as 0."""
        if "task_id" not in data:
            raise KeyError("an episode record needs task_id")
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known and v is not None})


def record_columns(records: Sequence[EpisodeRecord | None]) -> dict[str, np.ndarray]:
    """`non_tensor_batch` columns of a batch of records, one row each (`RECORD_COLUMNS`).

    `None` is a row without an episode (verl's batch padding): excluded, no tags. An excluded record
    has no tags either (`None` cells), so A-Patch leaves it at scale 1 (its advantages are zeroed anyway).
    The cells are Python lists / scalars in 1-D object arrays (numpy would turn equal-length tag lists
    into a 2-D array).
    """
    cols: dict[str, list[Any]] = {name: [] for name in RECORD_COLUMNS}
    for r in records:
        if r is not None and not isinstance(r, EpisodeRecord):
            raise TypeError(f"record_columns takes EpisodeRecords (or None for padding), got {type(r).__name__}")
        skip = r is None or r.excluded
        cols["task_id"].append(None if r is None else r.task_id)
        cols["category"].append(None if r is None else r.category)
        cols["failure_tags"].append(None if skip else list(r.failure_tags))
        cols["paper_labels"].append(None if skip else list(r.paper_labels))
        cols["excluded"].append(True if r is None else r.excluded)
    return {name: object_array(values) for name, values in cols.items()}


def object_array(values: Sequence[Any]) -> np.ndarray:
    """A 1-D object array holding `values` as they are."""
    out = np.empty(len(values), dtype=object)
    for i, v in enumerate(values):
        out[i] = v
    return out


def check_records(records: Sequence[Any], where: str) -> None:
    """Refuse anything but `EpisodeRecord`s: the core takes the typed record only."""
    for r in records:
        if not isinstance(r, EpisodeRecord):
            raise TypeError(f"{where} takes seal.core.record.EpisodeRecord items (Rollout.record() builds them), "
                            f"got {type(r).__name__}")

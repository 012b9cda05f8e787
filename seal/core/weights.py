"""Utility weight tables rho(z) for A-Patch and the capability state, one per diagnosis vocabulary.

A weight above 1 amplifies the GRPO advantage of trajectories whose turns carry that tag, a weight
below 1 damps it (A-Patch clips the trajectory mean to [0.5, 2.0], so the sign never flips).

* ``progress`` — the release's progress tags; the table is the paper's (docs/paper.md §5),
  identical to the release's A-Patch defaults (docs/release_behaviour.md §11.1).
* ``paper`` — the paper's six labels plus ``pass``. The paper gives no weights for them; this table
  is ours, built by analogy with the progress table (rationale in ``docs/seal_core.md``).

``checker_error`` / ``gt_error`` (``env_service.vocab.EXCLUDED_TAGS``) describe the harness, not the
policy: they are not in either table and A-Patch drops them before averaging. Tags missing from a
table (``unknown``, anything new) weigh ``DEFAULT_WEIGHT``.
"""

from __future__ import annotations

from env_service import vocab

DEFAULT_WEIGHT = 1.0

# Tag used by the capability state for a trajectory that arrived without any tag (docs/release_behaviour.md §10.1).
UNKNOWN_TAG = "unknown"

# docs/paper.md §5 / release A-Patch defaults (docs/release_behaviour.md §11.1).
PROGRESS_WEIGHTS: dict[str, float] = {
    vocab.SPURIOUS_TOOL_CALL: 2.0,
    vocab.CORRECT_ABSTENTION: 1.8,
    vocab.EMPTY_TURN: 1.5,
    vocab.STATE_MISMATCH: 1.0,
    vocab.RESPONSE_MISMATCH: 0.9,
    vocab.INSTANCE_MISMATCH: 0.6,
    vocab.PASS: 1.0,
}

# Ours, by analogy (docs/seal_core.md, "Paper-vocabulary weights"):
# * invalid_tool_call absorbs the progress vocabulary's spurious calls (a call to a tool that is not
#   available, e.g. a held-out miss_func tool, 2.0) and malformed calls that leave a turn without an
#   accepted call (counted as an empty turn there, 1.5) -> 1.8, between the two.
# * missing_tool_call is the paper's name for empty_turn_model_response -> 1.5.
# * recovery_failure: the turn was lost after an executable error, usually by giving up (an empty
#   turn, 1.5) or by a wrong retry (a state mismatch, 1.0) -> 1.3.
# * argument_mismatch: an executed call with wrong arguments, a state mismatch (1.0) with precise,
#   directly attributable evidence, ranked above it by the paper's priority -> 1.2.
# * state_mismatch, response_mismatch, pass: same tag, same weight as the progress table.
PAPER_WEIGHTS: dict[str, float] = {
    vocab.INVALID_TOOL_CALL: 1.8,
    vocab.ARGUMENT_MISMATCH: 1.2,
    vocab.STATE_MISMATCH: 1.0,
    vocab.RECOVERY_FAILURE: 1.3,
    vocab.MISSING_TOOL_CALL: 1.5,
    vocab.RESPONSE_MISMATCH: 0.9,
    vocab.PASS: 1.0,
}

_TABLES: dict[str, dict[str, float]] = {"progress": PROGRESS_WEIGHTS, "paper": PAPER_WEIGHTS}

# Which field of the env service's ``evaluate`` reply carries each vocabulary's per-turn tags.
REPLY_FIELDS: dict[str, str] = {"progress": "failure_tags", "paper": "paper_labels"}


def check_vocabulary(vocabulary: str) -> str:
    """Return ``vocabulary`` if it names a diagnosis vocabulary, else raise ``ValueError``."""
    if vocabulary not in vocab.VOCABULARIES:
        raise ValueError(f"unknown vocabulary {vocabulary!r}; expected one of {sorted(vocab.VOCABULARIES)}")
    return vocabulary


def base_weights(vocabulary: str) -> dict[str, float]:
    """A fresh copy of the utility weight table rho for ``vocabulary`` (``progress`` or ``paper``)."""
    return dict(_TABLES[check_vocabulary(vocabulary)])


def reply_field(vocabulary: str) -> str:
    """Name of the ``evaluate`` reply field holding the per-turn tags of ``vocabulary``."""
    return REPLY_FIELDS[check_vocabulary(vocabulary)]


def known_tags(vocabulary: str) -> frozenset[str]:
    """Every tag that may appear for ``vocabulary`` (its tags, the excluded ones and ``unknown``)."""
    return frozenset(vocab.VOCABULARIES[check_vocabulary(vocabulary)]) | vocab.EXCLUDED_TAGS | {UNKNOWN_TAG}

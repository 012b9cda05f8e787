"""Paper labels: one label per turn from executable evidence, by a fixed priority rule (docs/diagnosis.md).

Input per turn: the release-vocabulary progress tag (from re-executing the turn against the ground truth with
BFCL's ``state_checker`` / ``response_checker``) and the episode's own evidence (rejected messages, tool error
texts, the names the model called vs the ground truth's). The paper's priority puts direct executable failures
before downstream verifier failures; the first rule that matches wins:

1. invalid_tool_call  — a message in the turn was unparsable or called an unavailable/non-existent tool, or the
                        model called a tool in a turn where none should be called (``spurious_tool_call``).
2. argument_mismatch  — a call failed with an argument error (missing/unexpected argument, wrong type or value),
                        or the state is wrong although the model called every function the ground truth called
                        (the right functions with wrong arguments).
3. state_mismatch     — the state differs from the ground truth's (``state_mismatch`` / ``instance_mismatch``).
4. recovery_failure   — the turn got executable error feedback and still failed.
5. missing_tool_call  — no accepted call in a turn that needed one, or a needed function was never called.
6. response_mismatch  — the interaction was clean and complete, but the results the verifier needs are missing.

Passing turns (``pass``, ``correct_abstention``) are ``pass``; harness errors (``checker_error``, ``gt_error``)
keep their tag so that A-Patch and the capability state can exclude them in either vocabulary.
"""

from __future__ import annotations

from collections import Counter

from env_service import vocab
from env_service.tool_errors import is_argument_error
from env_service.trajectory import Turn


def paper_label(tag: str, turn: Turn | None, gt_names: list[str]) -> str:
    """Label one turn. ``turn`` is None for a turn the episode never reached."""
    if tag in vocab.SUCCESS_TAGS:
        return vocab.PASS
    if tag in vocab.EXCLUDED_TAGS:
        return tag
    turn = turn or Turn()
    calls = turn.accepted_calls()
    errors = [c.result for c in calls if c.is_error]
    rejected = turn.count(vocab.PARSE_ERROR) + turn.count(vocab.UNAVAILABLE_TOOL)
    missing_names = Counter(gt_names) - Counter(c.name for c in calls)

    if rejected or tag == vocab.SPURIOUS_TOOL_CALL:
        return vocab.INVALID_TOOL_CALL
    if any(is_argument_error(e) for e in errors) or (
        tag == vocab.STATE_MISMATCH and calls and not missing_names
    ):
        return vocab.ARGUMENT_MISMATCH
    if tag in (vocab.STATE_MISMATCH, vocab.INSTANCE_MISMATCH):
        return vocab.STATE_MISMATCH
    if errors:
        return vocab.RECOVERY_FAILURE
    if tag == vocab.EMPTY_TURN or missing_names:
        return vocab.MISSING_TOOL_CALL
    return vocab.RESPONSE_MISMATCH

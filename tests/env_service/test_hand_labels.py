"""The hand-labelled cases (tests/env_service/hand_labels.yaml): an oracle written from the paper's definitions, not
from the code's rules (docs/diagnosis.md, "Hand-labelled cases").

Every case is played through the service's Episode on its real BFCL task and graded by BFCL's own checkers (the
same path as `POST /episodes/{id}/evaluate`); the paper labels of the played turns must be the hand labels. A case
with a `today` field records a disagreement of the code: the test then asserts that exact label, so a change of
the code either way shows.
"""

from __future__ import annotations

import re
from collections import Counter
from functools import cache
from pathlib import Path

import pytest
import yaml

from env_service import vocab
from env_service.tool_errors import classify_tool_error, tool_error_message
from tests.env_service.test_diagnosis import TASKS, WIDE, grade
from tests.helpers import play_turns

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
CASES = yaml.safe_load((HERE / "hand_labels.yaml").read_text())
BY_ID = {case["id"]: case for case in CASES}


def paper_definitions() -> dict[str, str]:
    """The meaning of each failure label, as docs/paper.md §2's table states it."""
    text = (ROOT / "docs" / "paper.md").read_text()
    rows = re.findall(r"^\| \d \| `(\w+)` \| (.+?) \|$", text, re.M)
    return dict(rows)


@cache
def played(case_id: str) -> dict:
    case = BY_ID[case_id]
    return grade(case["task"], case["turns"])


def test_the_table_is_well_formed():
    assert len(CASES) >= 40
    assert len(BY_ID) == len(CASES), "case ids must be unique"
    definitions = paper_definitions()
    assert set(definitions) == set(vocab.PAPER_LABELS) - {vocab.PASS}
    for case in CASES:
        assert case["task"] in TASKS, case["id"]
        assert len(case["labels"]) == len(case["turns"]), case["id"]
        assert set(case["labels"]) <= set(vocab.PAPER_LABELS), case["id"]
        reason = " ".join(case["reason"].split())
        for label in set(case["labels"]) - {vocab.PASS}:  # the reason quotes the definition it applies
            assert f'{label} is "{definitions[label]}"' in reason, (case["id"], label)
        if set(case["labels"]) == {vocab.PASS}:
            assert '"A turn with no failure is pass"' in reason, case["id"]
        if "today" in case:
            assert case["today"] != case["labels"] and len(case["today"]) == len(case["labels"]), case["id"]


def test_every_label_and_case_kind_is_covered():
    counts = Counter(label for case in CASES for label in case["labels"])
    assert set(counts) == set(vocab.PAPER_LABELS)
    assert min(counts.values()) >= 2
    # the kinds the decision table distinguishes, named by the case ids' prefixes
    kinds = {"issue", "success", "repair", "argument", "state", "recovery", "carry", "missing", "response",
             "invalid", "empty_gt", "miss_param", "inherited"}
    assert all(any(case["id"].startswith(kind + "_") for case in CASES) for kind in kinds)


def test_repairs_cover_every_error_family_the_tasks_raise():
    """Repairs of every error family: in the played cases, an error followed in the same turn by a successful call
    of the same function, for each family below (read from the played results, not from the case names)."""
    repaired = set()
    for case in CASES:
        episode = play_turns(TASKS[case["task"]], case["turns"], WIDE, mode="train")
        for turn in episode.turns[: len(case["turns"])]:
            calls = turn.accepted_calls()
            for i, call in enumerate(calls):
                if call.is_error and any(c.name == call.name and not c.is_error for c in calls[i + 1:]):
                    repaired.add(classify_tool_error(tool_error_message(call.result)))
    assert repaired >= {"missing_argument", "unexpected_argument", "wrong_type", "invalid_value", "missing_path",
                        "unknown_identifier", "precondition"}


@pytest.mark.parametrize("case_id", list(BY_ID))
def test_hand_label(case_id):
    case = BY_ID[case_id]
    got = played(case_id)["paper_labels"][: len(case["turns"])]
    assert got == case.get("today", case["labels"]), (case_id, case["reason"])

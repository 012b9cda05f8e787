"""Golden renderings of what the model sees, raw and with each train-only interface component alone.

Regenerate after a deliberate change with ``SEAL_UPDATE_GOLDEN=1 pytest tests/env_service/test_golden_render.py``
and review the diff of ``tests/env_service/golden/``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from env_service.config import EpisodeConfig, StepLimit
from env_service.episode import Episode
from env_service.interface import parse_interface
from env_service.tasks import load_tasks

GOLDEN = Path(__file__).parent / "golden"
UPDATE = os.environ.get("SEAL_UPDATE_GOLDEN") == "1"
CONFIG = EpisodeConfig(step_limit=StepLimit("episode", 50))
INTERFACES = {
    "raw": None,
    "schema": {"version": 1, "schema": {"required": True, "enum": True, "types": True}},
    "error_feedback": {"version": 1, "error_feedback": True},
    "cues": {
        "version": 1,
        "cues": [
            {"tag": "state_mismatch", "text": "Check the latest tool results before changing anything."},
            {"tag": "empty_turn_model_response", "text": "Act with a tool when one fits the request."},
        ],
    },
}
# Actions that exercise every observation kind: a tool result, a tool error, a parse error, an unavailable tool.
ACTIONS = [
    '<tool_call>\n{"name": "ls", "arguments": {}}\n</tool_call>',
    '<tool_call>\n{"name": "cd", "arguments": {"folder": "no_such_dir"}}\n</tool_call>',
    '<tool_call>\n{"name": "cat", "arguments": {"filename": "x.txt"}}\n</tool_call>',
    "<tool_call>{not json}</tool_call>",
    '<tool_call>\n{"name": "launch_rocket", "arguments": {}}\n</tool_call>',
    "All done.",
]


def transcript(task_id: str, interface: dict | None, mode: str = "train", actions=ACTIONS) -> str:
    episode = Episode("g", load_tasks()[task_id], mode, parse_interface(interface), CONFIG)
    parts = [f"### {m['role']}\n{m['content']}" for m in episode.initial_messages()]
    for action in actions:
        reply = episode.step(action)
        parts.append(f"### assistant\n{action}")
        if reply["observation"] is not None:
            parts.append(
                f"### {reply['observation']['role']} (error_type={reply['info']['error_type']})\n"
                f"{reply['observation']['content']}"
            )
    return "\n\n".join(parts) + "\n"


def check_golden(name: str, text: str) -> None:
    path = GOLDEN / f"{name}.txt"
    if UPDATE:
        path.write_text(text)
    assert path.exists(), f"missing golden file {path}; run with SEAL_UPDATE_GOLDEN=1"
    assert text == path.read_text(), f"rendering changed: {name}"


@pytest.mark.parametrize("variant", sorted(INTERFACES))
def test_golden_base_task(variant):
    check_golden(f"base_0_{variant}", transcript("multi_turn_base_0", INTERFACES[variant]))


@pytest.mark.parametrize("variant", sorted(INTERFACES))
def test_golden_miss_func_task(variant):
    # turns 0..2 answered in plain text, then the reveal of `sort`, then a call to it
    actions = ["ok", "ok", "ok", '<tool_call>\n{"name": "sort", "arguments": {"file_name": "nope"}}\n</tool_call>']
    check_golden(f"miss_func_0_{variant}", transcript("multi_turn_miss_func_0", INTERFACES[variant], actions=actions))


def test_each_component_changes_only_its_part():
    raw = transcript("multi_turn_base_0", None)
    for name in ("schema", "error_feedback", "cues"):
        assert transcript("multi_turn_base_0", INTERFACES[name]) != raw, name
    raw_system = raw.split("### user")[0]
    assert transcript("multi_turn_base_0", INTERFACES["error_feedback"]).split("### user")[0] == raw_system


def test_eval_prompt_identical_whatever_training_interfaces_came_before():
    before = transcript("multi_turn_base_0", None, mode="eval")
    for name in ("schema", "error_feedback", "cues"):
        transcript("multi_turn_base_0", INTERFACES[name], mode="train")  # training episodes in between
        assert transcript("multi_turn_base_0", None, mode="eval") == before
    assert before == (GOLDEN / "base_0_raw.txt").read_text()
    # the wire format the trainer sends is plain JSON; an eval episode never accepts it (service test)
    json.dumps(INTERFACES)

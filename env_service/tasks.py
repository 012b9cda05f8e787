"""BFCL V3 multi-turn tasks: prompts, tool docs, held-out tools, ground truth and the train/eval split.

Everything comes from the ``bfcl-eval`` package data (``BFCL_v4_multi_turn_*``: the same 800 tasks as V3
multi-turn) and the split file ``data/bfcl_split.json`` (the authors' split, built by
``scripts/prepare_data.py``). Tool lists are built the way BFCL builds them
(``populate_test_cases_with_predefined_functions``): the docs of each involved class in order, with miss_func's
held-out docs moved out of the list and into the turn that reveals them.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

from env_service.bfcl import ANSWER_DIR, DATA_DIR, FUNC_DOC_DIR, MULTI_TURN_FUNC_DOC_FILE_MAPPING
from env_service.calls import bind_arguments, parse_call_string
from env_service.parser import format_tool_call
from env_service.vocab import CATEGORIES, category_of

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_SPLIT_FILE = REPO_ROOT / "data" / "bfcl_split.json"
SPLITS = ("train", "eval", "all")


@dataclass(frozen=True)
class Call:
    """A tool call with named arguments (ground-truth calls are stored in this form too)."""

    name: str
    arguments: dict[str, Any]


@dataclass
class Task:
    id: str
    category: str
    questions: list[str]  # first user message of each turn; "" for a miss_func reveal turn
    initial_config: dict
    involved_classes: list[str]
    tools: list[dict]  # docs available at the start, in BFCL's order
    held_out: dict[int, list[dict]]  # turn index -> docs revealed at that turn
    ground_truth: list[list[str]]  # BFCL's call strings per turn (fed to the official checker as is)
    gt_calls: list[list[Call]] = field(default_factory=list)  # the same calls with named arguments

    @property
    def num_turns(self) -> int:
        return len(self.questions)

    @property
    def long_context(self) -> bool:
        # BFCL: long_context = "long_context" in category or "composite" in category
        return "long_context" in self.category or "composite" in self.category

    @property
    def test_entry(self) -> dict:
        """The fields BFCL's multi-turn checker reads from a test entry."""
        return {
            "id": self.id,
            "initial_config": self.initial_config,
            "involved_classes": self.involved_classes,
        }

    def all_tool_names(self) -> set[str]:
        names = {d["name"] for d in self.tools}
        for docs in self.held_out.values():
            names.update(d["name"] for d in docs)
        return names


def _read_jsonl(path: Path) -> list[dict]:
    with open(path, encoding="utf-8") as fh:
        return [json.loads(line) for line in fh if line.strip()]


@cache
def _class_docs(class_name: str) -> tuple[dict, ...]:
    return tuple(_read_jsonl(FUNC_DOC_DIR / MULTI_TURN_FUNC_DOC_FILE_MAPPING[class_name]))


def _first_user_text(turn: list[dict]) -> str:
    for message in turn:
        if message.get("role") == "user":
            return message.get("content", "")
    return ""


def _build_task(entry: dict, answer: dict) -> Task:
    from env_service.executor import ToolExecutor  # local: the executor imports BFCL's classes

    tools: list[dict] = []
    for class_name in entry["involved_classes"]:
        tools.extend(json.loads(json.dumps(d)) for d in _class_docs(class_name))
    held_out: dict[int, list[dict]] = {}
    for turn, names in entry.get("missed_function", {}).items():
        docs = []
        for name in names:
            for i, doc in enumerate(tools):
                if doc["name"] == name:
                    docs.append(tools.pop(i))
                    break
        held_out[int(turn)] = docs
    task = Task(
        id=entry["id"],
        category=category_of(entry["id"]),
        questions=[_first_user_text(turn) for turn in entry["question"]],
        initial_config=entry["initial_config"],
        involved_classes=list(entry["involved_classes"]),
        tools=tools,
        held_out=held_out,
        ground_truth=answer["ground_truth"],
    )
    # Name positional ground-truth arguments from the real method signatures.
    probe = ToolExecutor(task.involved_classes, {}, long_context=False)
    for turn in task.ground_truth:
        calls = []
        for call in turn:
            name, positional, keywords = parse_call_string(call)
            calls.append(Call(name, bind_arguments(probe.method(name), positional, keywords)))
        task.gt_calls.append(calls)
    return task


@cache
def load_tasks() -> dict[str, Task]:
    """All 800 multi-turn tasks keyed by id (cached: about a second to build)."""
    tasks: dict[str, Task] = {}
    for category in CATEGORIES:
        entries = _read_jsonl(DATA_DIR / f"BFCL_v4_{category}.json")
        answers = {a["id"]: a for a in _read_jsonl(ANSWER_DIR / f"BFCL_v4_{category}.json")}
        for entry in entries:
            tasks[entry["id"]] = _build_task(entry, answers[entry["id"]])
    return tasks


@cache
def load_split(path: str | None = None) -> dict[str, list[str]]:
    """``{"train": [...], "eval": [...]}`` task ids (the authors' split)."""
    with open(path or DEFAULT_SPLIT_FILE, encoding="utf-8") as fh:
        split = json.load(fh)
    return {"train": list(split["train"]), "eval": list(split["eval"])}


def split_ids(split: str, path: str | None = None) -> list[str]:
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; expected one of {SPLITS}")
    if split == "all":
        return list(load_tasks())
    return load_split(path)[split]


TURN_END_REPLY = "Done."  # a plain reply: ends the turn in a replay


def ground_truth_replies(task_id: str, skip_turn: int | None = None) -> list[str]:
    """Assistant messages replaying the ground truth: one ``<tool_call>`` per step, a plain reply per turn.

    `skip_turn`: that turn (0-based) is answered with the plain reply alone, its calls left out (a replay
    that fails the turn's state and response checks).
    """
    texts: list[str] = []
    for i, turn in enumerate(ground_truth_tool_calls(task_id)):
        if i != skip_turn:
            texts += [format_tool_call(call["name"], call["arguments"]) for call in turn]
        texts.append(TURN_END_REPLY)
    return texts


def failing_twin_replies(task_id: str) -> list[str] | None:
    """The ground-truth replay with its last calling turn answered by the plain reply alone (None: no turn
    calls a tool). BFCL grades it a failure: that turn's state and response checks miss the calls."""
    calling = [i for i, turn in enumerate(ground_truth_tool_calls(task_id)) if turn]
    return ground_truth_replies(task_id, skip_turn=calling[-1]) if calling else None


def ground_truth_tool_calls(task_id: str) -> list[list[dict[str, Any]]]:
    """Ground-truth calls per turn as ``{"name", "arguments"}`` dicts (for replays and harness self-checks)."""
    task = load_tasks()[task_id]
    return [[{"name": c.name, "arguments": dict(c.arguments)} for c in turn] for turn in task.gt_calls]

"""Small helpers shared by the tests."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any


def sampled_spans(ids: list[int], mask: list[int]) -> list[list[int]]:
    """The runs of ``ids`` where ``mask`` is 1: the model's sampled spans of a token-exact response."""
    out, cur = [], []
    for value, keep in zip(ids, mask, strict=True):
        if keep:
            cur.append(value)
        elif cur:
            out.append(cur)
            cur = []
    return out + ([cur] if cur else [])


def play_turns(task: Any, turns: list[list[str]], config: Any, mode: str = "eval") -> Any:
    """An ``env_service`` episode of ``task`` (raw interface) played with raw assistant messages turn by turn;
    each turn is closed with a plain reply. Returns the episode (call ``evaluate()`` for its verdict)."""
    from env_service.episode import Episode
    from env_service.interface import parse_interface

    episode = Episode("t", task, mode, parse_interface(None), config)
    for messages in turns:
        for content in messages:
            episode.step(content)
        if not episode.done:
            episode.step("Done.")
    return episode


def mapped_elsewhere(name: str) -> bool:
    """Whether a live process other than this one maps /dev/shm/`name` (another job's segment on a shared
    machine; a test's own engine processes are gone by the time it looks)."""
    for maps in Path("/proc").glob("[0-9]*/maps"):
        if maps.parent.name == str(os.getpid()):
            continue
        try:
            if f"/dev/shm/{name}" in maps.read_text():
                return True
        except OSError:
            continue
    return False

"""How a user spells recipe values and keys on the command line: YAML's word booleans kept as the words a
string key expects, and "did you mean" for a misspelt key (recipe keys and verl's)."""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

from omegaconf import DictConfig, OmegaConf

# YAML 1.1 reads these words as booleans (OmegaConf follows it): `error_feedback=off` would arrive as False.
YAML_BOOLEAN_WORDS = frozenset({"on", "off", "yes", "no"})


def dotted_keys(tree: Mapping[str, Any] | DictConfig, prefix: str = "") -> Iterator[str]:
    """Every dotted key of a nested mapping (sections and leaves)."""
    if isinstance(tree, DictConfig):
        tree = OmegaConf.to_container(tree, resolve=False, throw_on_missing=False)
    for key, value in tree.items():
        dotted = f"{prefix}.{key}" if prefix else str(key)
        yield dotted
        if isinstance(value, Mapping):
            yield from dotted_keys(value, dotted)


def did_you_mean(key: str, known: Iterable[str]) -> str:
    """``"; did you mean 'x'?"`` for the closest known dotted keys, else ``""`` (appended to an error)."""
    candidates = [k for k in known if not k.rpartition(".")[2].startswith("_")]  # not verl's `_target_`
    close = difflib.get_close_matches(key, candidates, n=3, cutoff=0.75)
    return "; did you mean " + " or ".join(repr(k) for k in close) + "?" if close else ""


def keep_string_words(overrides: Sequence[str], schema: DictConfig) -> list[str]:
    """Overrides with a YAML word boolean (`off`, `on`, `yes`, `no`) quoted where the schema's key holds a
    string, so `seal.interface.error_feedback=off` means the mode "off" (a bool key still reads it as false)."""
    out = []
    for item in overrides:
        key, sep, value = str(item).partition("=")
        if sep and value.strip().lower() in YAML_BOOLEAN_WORDS:
            current = OmegaConf.select(schema, key.lstrip("+").strip(), default=None, throw_on_missing=False)
            if isinstance(current, str):
                item = f"{key}={value.strip().lower()!r}"  # the words are case-free in YAML too
        out.append(item)
    return out

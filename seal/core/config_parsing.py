"""Config dataclasses: how a knob is declared and how its declared range or value set is checked.

Every knob of a run is a dataclass field declared with ``knob(default, source=..., help=...)``: the
default, where it comes from (``paper`` Table 4, the authors' ``release``, or ``ours``), a one-line
help text and the values it allows (``choices``; ``ge`` / ``gt`` / ``le`` bounds, optionally with an
``off`` value outside them) live in one place. ``knob_problems`` is the one check of those
constraints, and the recipe reference (``docs/config.md``) shows them (``allowed_text``). A list or
mapping knob's constraints hold for each item (each value of a mapping). Rules that span knobs
belong to the class that owns them (``__post_init__``) or to the recipe root (``Recipe.check``).

The config dataclasses are records: building one by hand checks only its cross-knob rules; the
recipe root checks every knob of the tree when it is built (``seal.recipe``).

Explicit zeros stay zeros — the release parsed its knobs with ``value or default``, which turned an
explicit ``0`` into the default (``docs/release_differences.md``, row 15). A config that sets
``release_zero_fallback: true`` gets that release behaviour back for the knobs its class lists in
``RELEASE_OR_DEFAULT_FIELDS`` (applied in the dataclass's ``__post_init__``).

Pure Python: the SEAL core must not depend on the recipe loader.
"""

from __future__ import annotations

import copy
import dataclasses
import math
import types
import typing
from collections.abc import Callable, Iterable, Mapping
from typing import Any

SOURCES = ("paper", "release", "ours")


def knob(default: Any = dataclasses.MISSING, *, source: str, help: str, factory: Callable[[], Any] | None = None,
         choices: Iterable[Any] | None = None, ge: float | None = None, gt: float | None = None,
         le: float | None = None, off: float | None = None) -> Any:
    """A dataclass field with its source tag, help text and optional constraints in ``metadata``.

    ``choices``: the allowed values; ``ge`` / ``gt`` / ``le``: bounds of a finite number; ``off``: one
    more value outside the bounds that switches the knob off (``top_k: -1``). ``None`` always passes
    (a nullable knob that is unset). A list or dict default is copied for every instance (dataclasses
    refuse shared mutable defaults).
    """
    if source not in SOURCES:
        raise ValueError(f"knob source must be one of {SOURCES}, got {source!r}")
    if not help or "\n" in help:
        raise ValueError("knob help must be one non-empty line")
    if off is not None and ge is None and gt is None and le is None:
        raise ValueError("knob off needs a range (ge / gt / le) that it lies outside of")
    metadata: dict[str, Any] = {"source": source, "help": help}
    for name, value in (("choices", tuple(choices) if choices is not None else None), ("ge", ge), ("gt", gt),
                        ("le", le), ("off", off)):
        if value is not None:
            metadata[name] = value
    if factory is None and isinstance(default, (list, dict)):
        frozen = copy.deepcopy(default)

        def factory() -> Any:
            return copy.deepcopy(frozen)
    if factory is not None:
        return dataclasses.field(default_factory=factory, metadata=metadata)
    return dataclasses.field(default=default, metadata=metadata)


def range_bounds(meta: Mapping[str, Any]) -> str:
    """A knob's range as text: `[a, b]`, `(a, b]`, `>= a`, `> a`, `<= b` (+ `or <off> (off)`), "" when none."""
    low = f"({meta['gt']}" if "gt" in meta else f"[{meta['ge']}" if "ge" in meta else None
    high = f"{meta['le']}]" if "le" in meta else None
    if low and high:
        bounds = f"{low}, {high}"
    elif low:
        bounds = f"{'>' if 'gt' in meta else '>='} {low[1:]}"
    else:
        bounds = f"<= {high[:-1]}" if high else ""
    return f"{bounds} or {meta['off']} (off)" if bounds and "off" in meta else bounds


def allowed_text(meta: Mapping[str, Any], each: bool = False) -> str:
    """The values a knob allows, as the reference shows them ("" when any value of its type goes);
    `each`: the knob is a list or mapping whose items are constrained."""
    text = "one of " + ", ".join(str(c) for c in meta["choices"]) if "choices" in meta else range_bounds(meta)
    return f"each {text}" if text and each else text


def type_name(hint: Any) -> str:
    """A field's type as the reference and the loader's messages write it: `int | null`, `list[str]`."""
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        names = [type_name(a) for a in args if a is not type(None)]
        return " | ".join(names) + (" | null" if type(None) in args else "")
    if origin in (list, tuple):
        return f"list[{type_name(args[0])}]"
    if origin is dict:
        return f"dict[{type_name(args[0])}, {type_name(args[1])}]"
    return "null" if hint is type(None) else getattr(hint, "__name__", str(hint))


def _in_range(value: Any, meta: Mapping[str, Any]) -> bool:
    if "off" in meta and value == meta["off"] and not isinstance(value, bool):
        return True
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return False
    return (("ge" not in meta or value >= meta["ge"]) and ("gt" not in meta or value > meta["gt"])
            and ("le" not in meta or value <= meta["le"]))


def _value_problems(key: str, value: Any, meta: Mapping[str, Any]) -> list[str]:
    """One value (a scalar, or one item of a list or mapping knob) against the knob's constraints."""
    if value is None:
        return []
    choices = meta.get("choices")
    if choices is not None and value not in choices:
        return [f"{key}: must be one of {list(choices)}, got {value!r}"]
    if any(bound in meta for bound in ("ge", "gt", "le")) and not _in_range(value, meta):
        bounds = range_bounds(meta)
        text = f"must lie in {bounds}" if "," in bounds else f"must be {bounds}"
        return [f"{key}: {text}, got {value!r} ({meta['help']})"]
    return []


def _nested_values(value: Any) -> Mapping[str, Any] | None:
    """The fields of a nested config given as an instance or a mapping."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return field_values(value)
    return value if isinstance(value, Mapping) else None


def knob_problems(cls: type, values: Mapping[str, Any], prefix: str = "") -> list[str]:
    """The ``knob`` constraints of ``cls``'s fields that ``values`` (field name -> value) violate.

    Messages name the dotted key (``prefix`` + field name; ``[i]`` or ``.name`` for an item of a list
    or mapping knob). A nested config dataclass (given as an instance or as a mapping) is checked
    field by field, depth first.
    """
    problems: list[str] = []
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        value = values.get(f.name)
        key = f"{prefix}.{f.name}" if prefix else f.name
        if dataclasses.is_dataclass(hints[f.name]):
            nested = _nested_values(value)
            problems += knob_problems(hints[f.name], nested, key) if nested is not None else []
            continue
        meta = f.metadata
        if isinstance(value, (list, tuple)) and "choices" in meta:  # an unknown list item is named by its value
            problems += [f"{key}: unknown {f.name} {item!r}; known: {list(meta['choices'])}"
                         for item in value if item not in meta["choices"]]
        elif isinstance(value, (list, tuple)):
            problems += [p for i, item in enumerate(value) for p in _value_problems(f"{key}[{i}]", item, meta)]
        elif isinstance(value, Mapping):
            problems += [p for k, item in value.items() for p in _value_problems(f"{key}.{k}", item, meta)]
        else:
            problems += _value_problems(key, value, meta)
    return problems


def field_problems(config: Any, prefix: str = "") -> list[str]:
    """``knob_problems`` of a config dataclass instance and of every config dataclass it holds."""
    return knob_problems(type(config), field_values(config), prefix)


def field_values(config: Any) -> dict[str, Any]:
    """The fields of a config dataclass as keyword arguments (shallow: values are not copied)."""
    return {f.name: getattr(config, f.name) for f in dataclasses.fields(config)}


def apply_release_zero_fallback(config: Any, field_names: tuple[str, ...]) -> None:
    """Reproduce the release's ``value or default`` parsing on a frozen dataclass, in place.

    Called from ``__post_init__`` only when ``config.release_zero_fallback`` is true: every listed
    field whose value is falsy (0, 0.0) is replaced by the class default.
    """
    for name in field_names:
        if not getattr(config, name):
            default = next(f for f in dataclasses.fields(config) if f.name == name).default
            object.__setattr__(config, name, default)

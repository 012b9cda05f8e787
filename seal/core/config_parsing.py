"""Config dataclasses: how a knob is declared, built from a plain mapping, and range-checked.

Every knob of a run is a dataclass field declared with ``knob(default, source=..., help=...)``: the
default, where it comes from (``paper`` Table 4, the authors' ``release``, or ``ours``) and a one-line
help text live in one place, and the recipe reference (``docs/config.md``) is generated from them.
A knob may also carry simple constraints (``choices``, ``ge``, ``gt``, ``le``) that
``field_problems`` checks; classes with richer rules check themselves in ``__post_init__``.

Building from a mapping (``config_from_mapping``, used by each class's ``from_dict``):

* unknown keys are an error (a typo must not silently fall back to a default);
* explicit zeros stay zeros — the release parsed its knobs with ``value or default``, which turned an
  explicit ``0`` into the default (``docs/release_differences.md``, row 15). A config that sets
  ``release_zero_fallback: true`` gets that release behaviour back for the knobs its class lists in
  ``RELEASE_OR_DEFAULT_FIELDS`` (applied in the dataclass's ``__post_init__``).

Pure Python: the SEAL core must not depend on the recipe loader (OmegaConf is used only when a
caller hands in a ``DictConfig``).
"""

from __future__ import annotations

import copy
import dataclasses
import math
from collections.abc import Callable, Iterable, Mapping
from typing import Any, TypeVar

T = TypeVar("T")

SOURCES = ("paper", "release", "ours")
# Constraint names a knob may carry, in the order field_problems reports them.
CONSTRAINTS = ("choices", "ge", "gt", "le")


def knob(default: Any = dataclasses.MISSING, *, source: str, help: str, factory: Callable[[], Any] | None = None,
         choices: Iterable[Any] | None = None, ge: float | None = None, gt: float | None = None,
         le: float | None = None) -> Any:
    """A dataclass field with its source tag, help text and optional constraints in ``metadata``.

    A list or dict default is copied for every instance (dataclasses refuse shared mutable defaults).
    """
    if source not in SOURCES:
        raise ValueError(f"knob source must be one of {SOURCES}, got {source!r}")
    if not help or "\n" in help:
        raise ValueError("knob help must be one non-empty line")
    metadata: dict[str, Any] = {"source": source, "help": help}
    for name, value in (("choices", tuple(choices) if choices is not None else None), ("ge", ge), ("gt", gt),
                        ("le", le)):
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
    """A knob's range as text: `[a, b]`, `(a, b]`, `>= a`, `> a`, `<= b`, or "" when it has none."""
    low = f"({meta['gt']}" if "gt" in meta else f"[{meta['ge']}" if "ge" in meta else None
    high = f"{meta['le']}]" if "le" in meta else None
    if low and high:
        return f"{low}, {high}"
    if low:
        return f"{'>' if 'gt' in meta else '>='} {low[1:]}"
    return f"<= {high[:-1]}" if high else ""


def _range_text(meta: Mapping[str, Any]) -> str:
    bounds = range_bounds(meta)
    if not bounds:
        return ""
    return f"must lie in {bounds}" if "," in bounds else f"must be {bounds}"


def _in_range(value: Any, meta: Mapping[str, Any]) -> bool:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return False
    return (("ge" not in meta or value >= meta["ge"]) and ("gt" not in meta or value > meta["gt"])
            and ("le" not in meta or value <= meta["le"]))


def knob_problems(cls: type, values: Mapping[str, Any], prefix: str = "") -> list[str]:
    """The ``knob`` constraints of ``cls``'s fields that ``values`` (field name -> value) violate.

    Messages name the dotted key (``prefix`` + field name). ``None`` passes (a nullable knob that is
    unset); list values are checked item by item against ``choices``. Nested configs are not entered.
    """
    problems: list[str] = []
    for f in dataclasses.fields(cls):
        value = values.get(f.name)
        meta = f.metadata
        if value is None or "source" not in meta:
            continue
        key = f"{prefix}.{f.name}" if prefix else f.name
        choices = meta.get("choices")
        if choices is not None:
            if isinstance(value, (list, tuple)):
                problems += [f"{key}: unknown {f.name} {item!r}; known: {list(choices)}"
                             for item in value if item not in choices]
            elif value not in choices:
                problems.append(f"{key}: must be one of {list(choices)}, got {value!r}")
        if any(name in meta for name in ("ge", "gt", "le")) and not _in_range(value, meta):
            problems.append(f"{key}: {_range_text(meta)}, got {value!r} ({meta['help']})")
    return problems


def field_problems(config: Any, prefix: str = "") -> list[str]:
    """``knob_problems`` of ``config`` and of every config dataclass it holds, depth first."""
    values = field_values(config)
    problems: list[str] = []
    for name, value in values.items():
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            problems += field_problems(value, f"{prefix}.{name}" if prefix else name)
    return problems + knob_problems(type(config), values, prefix)


def plain_mapping(data: Any) -> dict[str, Any]:
    """A plain ``dict`` from a ``dict``-like or an OmegaConf ``DictConfig`` (resolved)."""
    try:  # OmegaConf is a project dependency, but keep the SEAL core importable without it.
        from omegaconf import DictConfig, OmegaConf

        if isinstance(data, DictConfig):
            data = OmegaConf.to_container(data, resolve=True)
    except ImportError:  # pragma: no cover - omegaconf is installed in the project venv
        pass
    if not isinstance(data, Mapping):
        raise TypeError(f"expected a mapping, got {type(data).__name__}")
    return dict(data)


def config_from_mapping(cls: type[T], data: Any) -> T:
    """``cls(**data)`` after rejecting keys ``cls`` does not define. ``None`` gives the defaults."""
    if data is None:
        return cls()
    if isinstance(data, cls):
        return data
    mapping = plain_mapping(data)
    known = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    unknown = sorted(set(mapping) - known)
    if unknown:
        raise ValueError(f"{cls.__name__}: unknown keys {unknown}; known keys: {sorted(known)}")
    return cls(**mapping)


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

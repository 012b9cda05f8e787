"""No state shared between episodes: BFCL instances never alias module-level data of BFCL's modules.

Audit (docs/env_service.md, tests/env_service/test_isolation.py): none of the eight multi-turn classes keeps
class-level mutable state, but ``TravelAPI._load_scenario(long_context=True)`` puts the dicts of
``long_context.CREDIT_CARD_EXTENSION`` and ``BOOKING_RECORD_EXTENSION`` into the instance by reference, so a
booking or payment in one episode changed the cards and bookings every later long-context episode (and BFCL's
checker) saw. Rather than trusting a list, every stateful class gets a wrapper on ``_load_scenario``: the first
load of a class (per long-context flag) finds the attributes that reach objects held by the module globals of
BFCL's tool modules, and every load deep-copies those attributes. The wrapper sits on the class, so the instances
BFCL's own checker builds at grading are isolated too.
"""

from __future__ import annotations

import copy
import functools
import sys
import types
from typing import Any

_CONTAINERS = (dict, list, set)
_SCAN_LIMIT = 2_000_000  # objects visited per scan; BFCL's largest module data is well below


def _is_container(value: Any) -> bool:
    return isinstance(value, _CONTAINERS) or (
        hasattr(value, "__dict__") and not isinstance(value, (type, types.ModuleType, types.FunctionType))
    )


def _children(value: Any) -> list[Any]:
    if isinstance(value, dict):
        return list(value.values())
    if isinstance(value, (list, set)):
        return list(value)
    return list(vars(value).values())


def reachable_ids(roots: list[Any]) -> set[int]:
    """Ids of every mutable container reachable from ``roots`` (iterative, bounded)."""
    seen: set[int] = set()
    stack = [r for r in roots if _is_container(r)]
    while stack and len(seen) < _SCAN_LIMIT:
        value = stack.pop()
        if id(value) in seen:
            continue
        seen.add(id(value))
        stack.extend(c for c in _children(value) if _is_container(c))
    return seen


@functools.cache
def module_data_ids(module_name: str) -> frozenset[int]:
    """Containers held by the globals of a BFCL tool module and of the tool modules it imported from."""
    package = module_name.rsplit(".", 1)[0]
    roots = [
        value
        for name, module in list(sys.modules.items())
        if module is not None and (name == module_name or name.startswith(package + "."))
        for value in vars(module).values()
        if _is_container(value)
    ]
    return frozenset(reachable_ids(roots))


def aliased_attributes(instance: Any) -> tuple[str, ...]:
    """Attributes of a loaded instance that reach module-level data of its module's package."""
    shared = module_data_ids(type(instance).__module__)
    return tuple(
        name
        for name, value in vars(instance).items()
        if _is_container(value) and not reachable_ids([value]).isdisjoint(shared)
    )


def isolate_class(cls: type) -> type:
    """Wrap ``cls._load_scenario`` so that every load deep-copies the attributes that alias module data."""
    original = cls.__dict__.get("_load_scenario")
    if original is None or getattr(original, "_seal_isolated", False):
        return cls
    aliased: dict[bool, tuple[str, ...]] = {}

    @functools.wraps(original)
    def _load_scenario(self, scenario: dict, long_context: bool = False, *args, **kwargs):
        result = original(self, scenario, long_context, *args, **kwargs)
        key = bool(long_context)
        if key not in aliased:
            aliased[key] = aliased_attributes(self)
        for name in aliased[key]:
            setattr(self, name, copy.deepcopy(getattr(self, name)))
        return result

    _load_scenario._seal_isolated = True  # type: ignore[attr-defined]
    cls._load_scenario = _load_scenario
    return cls

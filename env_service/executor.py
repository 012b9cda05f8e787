"""Per-episode BFCL tool execution: class instances, dispatch by name, BFCL-identical result text.

BFCL's own executor (``multi_turn_utils.execute_multi_turn_func_call``) keeps instances in module globals and
``eval``s call strings. We keep the same semantics without either: each ``ToolExecutor`` owns fresh instances
(built exactly as BFCL builds them), dispatches a validated name to the bound method with keyword arguments,
and formats the return value the way BFCL does. Nothing outlives the executor; nothing is evaluated.
"""

from __future__ import annotations

import copy
import importlib
import inspect
import json
from functools import cache
from typing import Any

from env_service.bfcl import BFCL_FORBIDDEN_NAMES, CLASS_FILE_PATH_MAPPING, STATELESS_CLASSES
from env_service.budget import BudgetExceeded
from env_service.isolation import isolate_class
from env_service.tool_errors import ERROR_PREFIX

# Arguments that make a single call run for minutes (e.g. power(10, 10**9) computes a billion-digit integer)
# and would stall the whole service. The official harness has no guard; these bounds are far above any value
# in BFCL's data. A guarded call is over the action's cost budget (env_service/budget.py). (ours)
RESOURCE_GUARDS: dict[tuple[str, str], int] = {
    ("power", "exponent"): 10_000,
    ("square_root", "precision"): 10_000,
    ("round_number", "decimal_places"): 10_000,
    ("logarithm", "precision"): 10_000,
}
MAX_POWER_BITS = 1_000_000  # an integer power with a longer result (~300,000 digits) is refused
MESSAGE_ID_SPACE = 90_000  # MessageAPI draws ids from randint(10000, 99999) until it finds an unused one


def guard(instance: Any, name: str, arguments: dict[str, Any]) -> None:
    """Refuse a known-expensive call before it runs (raises ``BudgetExceeded``). Applied wherever our executor
    runs BFCL code: at step and in the per-turn replay at grading; BFCL's checker never sees a refused call."""
    for key, value in arguments.items():
        bound = RESOURCE_GUARDS.get((name, key))
        if bound is not None and isinstance(value, (int, float)) and abs(value) > bound:
            raise BudgetExceeded("guard", f"argument '{key}' of '{name}' is above {bound}.")
    if name == "power":
        base, exponent = arguments.get("base"), arguments.get("exponent")
        if type(base) is int and type(exponent) is int and base.bit_length() * exponent > MAX_POWER_BITS:
            raise BudgetExceeded("guard", f"'power' would compute an integer of more than {MAX_POWER_BITS} bits.")
    # BFCL's id generator loops forever once its 90,000 ids are used up (reachable within the step limit with
    # parallel calls); the call is refused before that.
    used = getattr(instance, "generated_ids", None)
    if name == "send_message" and isinstance(used, set) and len(used) >= MESSAGE_ID_SPACE - 1:
        raise BudgetExceeded("guard", "'send_message' has used up the message id space.")


@cache
def tool_class(class_name: str) -> type:
    """A BFCL tool class, isolated on first use (``env_service.isolation``): no instance shares module data."""
    module = importlib.import_module(CLASS_FILE_PATH_MAPPING[class_name])
    return isolate_class(getattr(module, class_name))


@cache
def public_method_names(class_name: str) -> tuple[str, ...]:
    """Public methods of a BFCL class — the only names a tool call can ever reach."""
    # Same discovery as BFCL: bound methods of an instance, private names skipped.
    instance = tool_class(class_name)()
    return tuple(
        name
        for name, _ in inspect.getmembers(instance, predicate=inspect.ismethod)
        if not name.startswith("_")
    )


def format_result(result: Any) -> str:
    """BFCL's result formatting: ``str`` as is, ``dict`` through ``json.dumps`` (``str`` if that fails),
    anything else ``str``. BFCL tests the exact type (``type(x) == dict``), so subclasses go through ``str``."""
    if type(result) is str:
        return result
    if type(result) is dict:
        try:
            return json.dumps(result)
        except Exception:
            return str(result)
    return str(result)


class ToolExecutor:
    """The BFCL class instances of one episode (or one grading pass) and dispatch into them."""

    def __init__(self, involved_classes: list[str], initial_config: dict, long_context: bool) -> None:
        self.instances: dict[str, Any] = {}
        # method name -> class name; later classes win on a name clash, as in BFCL's mapping
        self.owner: dict[str, str] = {}
        for class_name in involved_classes:
            instance = tool_class(class_name)()
            if class_name not in STATELESS_CLASSES:
                config = copy.deepcopy(initial_config.get(class_name, {}))
                instance._load_scenario(config, long_context=long_context)
            self.instances[class_name] = instance
            for name in public_method_names(class_name):
                self.owner[name] = class_name

    def knows(self, name: str) -> bool:
        return name in self.owner

    def method(self, name: str) -> Any:
        return getattr(self.instances[self.owner[name]], name)

    def call(self, name: str, arguments: dict[str, Any], reply_bytes: int | None = None) -> str:
        """Execute one validated call; the result or error text is exactly what BFCL's executor produces.

        Raises ``BudgetExceeded`` for a known-expensive call (``guard``), a memory error, or a result longer
        than ``reply_bytes``."""
        if name not in self.owner:
            raise KeyError(name)  # callers validate names first; this is a programming error
        instance = self.instances[self.owner[name]]
        try:
            if name in BFCL_FORBIDDEN_NAMES:
                raise Exception(f"Function call {name} is not allowed.")
            guard(instance, name, arguments)
            # BFCL's methods keep argument objects (post_tweet stores `mentions`; mention() later extends it),
            # so each execution gets its own copy: recorded calls and cached ground truth never change.
            result = format_result(getattr(instance, name)(**copy.deepcopy(arguments)))
        except BudgetExceeded:
            raise
        except MemoryError:  # the worker's address-space limit (env_service/workers.py)
            raise BudgetExceeded("memory", f"'{name}' ran out of the memory allowed to one action.") from None
        except Exception as exc:  # BFCL turns every exception into an observation, so do we
            result = f"{ERROR_PREFIX}{exc}"
        if reply_bytes is not None and len(result) > reply_bytes:
            raise BudgetExceeded("reply", f"the result of '{name}' is longer than {reply_bytes} characters.")
        return result

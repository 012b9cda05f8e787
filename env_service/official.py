"""The ``official`` rules profile: BFCL's multi-turn pipeline for the Qwen function-calling format, restated.

BFCL's Qwen FC handler (prompting mode) plays a multi-turn task like this, and so does an ``official`` episode:

* Prompt. The tools of the involved classes (miss_func's held-out ones left out), each description with
  BFCL's Python hint appended, one ``json.dumps`` per line in Qwen's ``<tools>`` layout; no system text of its
  own. Tool results go back as ``<tool_response>`` blocks, one per call, in one user message. A held-out
  function is revealed with BFCL's prompting-mode message, which prints the docs as a Python list (``str``),
  without the hint; the tool list of the prompt stays as it was.
* Decoding. Only blocks written exactly ``<tool_call>\\n...\\n</tool_call>`` count (a newline inside both
  tags); a block whose body is not JSON is skipped, so the valid calls of a mixed reply run. A reply after a
  ``</think>`` is read from after its last ``</think>``. A reply is undecodable when a block holds JSON that is
  not an object, an object without ``name`` or ``arguments``, a name that is a list or object, or arguments that
  are not an object (a string is JSON-decoded first). An undecodable reply, or one without calls, ends the turn:
  no error observation and no retry.
* Execution. Every call of a decoded reply runs on the task's classes, held-out functions included before
  their reveal (BFCL executes any method of the involved classes); a name that is not one of them gets
  Python's error text, as BFCL's ``eval`` of it does. Result texts are the executor's (``Error during
  execution: ...`` for exceptions).
* Steps. Within a turn, each reply whose calls ran is a step; after the 21st (``MAXIMUM_STEP_LIMIT`` + 1)
  BFCL force-quits the whole task. Replies that end a turn are not counted. There is no per-episode cap and no
  length limit besides the model's context.
* History. BFCL keeps the tool calls it extracted from each reply in its chat history and renders them into
  the next prompt; a block it cannot render (JSON that is not an object with a string ``name`` and an
  ``arguments`` key) makes its next model query fail, and the task is recorded as an inference error (a
  failure). When no further query follows (the reply ends the last turn, or the task is force-quit), nothing
  fails.

Nothing here is BFCL's code: the rules are restated and the test suite plays the same scripted replies through
bfcl-eval's own handler loop and eval runner, requiring the same verdict task by task
(tests/eval/test_bfcl_oracle.py). Model text is only ``json.loads``-ed and ``ast.parse``-d, never evaluated.
"""

from __future__ import annotations

import ast
import json
import math
import re
from dataclasses import dataclass, field
from typing import Any

from env_service.bfcl import (
    BFCL_FORBIDDEN_NAMES,
    DEFAULT_USER_PROMPT_FOR_ADDITIONAL_FUNCTION_PROMPTING,
    MAXIMUM_STEP_LIMIT,
)
from env_service.calls import format_call, is_valid_argument_name
from env_service.tool_errors import ERROR_PREFIX

# BFCL's language hint for Python tools, appended to every description in the prompt.
PYTHON_HINT = " Note that the provided function is in Python 3 syntax."
# A block as BFCL's Qwen handler extracts it: a newline right inside both tags, the shortest body.
_BLOCK = re.compile(r"<tool_call>\n(.*?)\n</tool_call>", re.DOTALL)
THINK_END = "</think>"
# Model calls one turn can take: the steps before the force-quit, or MAXIMUM_STEP_LIMIT steps and the reply
# that ends the turn.
MAX_CALLS_PER_TURN = MAXIMUM_STEP_LIMIT + 1
# What the checker is given for a call that can only fail (a name outside the task's classes, argument names
# that are not Python, non-finite numbers): a call of a name defined nowhere, so BFCL's checker records an
# error and no state changes, exactly as for the original call, without ever passing model text to its eval.
UNRUNNABLE_CALL = "seal_unrunnable_call()"


# --- prompt ---------------------------------------------------------------------------------------------


def prompt_tools(docs: list[dict]) -> list[dict]:
    """The tool docs as BFCL's prompt shows them: copies, each description with the Python hint."""
    shown = []
    for doc in docs:
        doc = json.loads(json.dumps(doc))
        doc["description"] = doc["description"] + PYTHON_HINT
        shown.append(doc)
    return shown


def reveal_message(docs: list[dict]) -> str:
    """BFCL's prompting-mode message for held-out functions: the raw docs printed as a Python list."""
    return DEFAULT_USER_PROMPT_FOR_ADDITIONAL_FUNCTION_PROMPTING.format(functions=docs)


def tool_responses(results: list[str]) -> str:
    """The user message BFCL's Qwen prompt makes of consecutive tool results."""
    return "\n".join(f"<tool_response>\n{result}\n</tool_response>" for result in results)


# --- decoding -------------------------------------------------------------------------------------------


@dataclass
class Decoded:
    """One reply as BFCL reads it."""

    calls: list[tuple[Any, dict[str, Any]]] = field(default_factory=list)  # (name, arguments), in order
    error: str | None = None  # set: undecodable, the turn ends and nothing runs
    breaks_history: bool = False  # BFCL's next model query would fail on this reply


def _blocks(text: str) -> list[Any]:
    found = []
    for body in _BLOCK.findall(text):
        try:
            found.append(json.loads(body))
        except (ValueError, RecursionError):
            continue  # BFCL skips a block it cannot parse
    return found


def _renders(block: Any) -> bool:
    """Whether BFCL's Qwen prompt can render this extracted block from its chat history."""
    if not isinstance(block, dict):
        return False
    call = block.get("function", block)
    return isinstance(call, dict) and isinstance(call.get("name"), str) and "arguments" in call


def decode(text: str) -> Decoded:
    """Read one reply by BFCL's rules (module docstring). Never raises on any input string."""
    breaks = not all(_renders(b) for b in _blocks(text))
    if THINK_END in text:
        text = text.split(THINK_END)[-1].lstrip("\n")
    blocks = _blocks(text)
    if any(not isinstance(b, dict) for b in blocks):
        return Decoded(error="a <tool_call> block holds JSON that is not an object", breaks_history=breaks)
    calls = []
    for block in blocks:
        if "name" not in block or "arguments" not in block:
            return Decoded(error="a tool call needs both 'name' and 'arguments'", breaks_history=breaks)
        name, arguments = block["name"], block["arguments"]
        if isinstance(name, (list, dict)):
            return Decoded(error="a tool call's name must be a string", breaks_history=breaks)
        if isinstance(arguments, str):
            try:
                arguments = json.loads(arguments)
            except (ValueError, RecursionError):
                return Decoded(error="the arguments string is not JSON", breaks_history=breaks)
        if not isinstance(arguments, dict):
            return Decoded(error="the arguments must be a JSON object", breaks_history=breaks)
        calls.append((name, arguments))
    return Decoded(calls=calls, breaks_history=breaks)


# --- execution ------------------------------------------------------------------------------------------


def _first_non_finite(value: Any) -> str | None:
    """'nan' or 'inf' for the first non-finite number in `value` in written order: BFCL writes the call with
    ``repr``, and ``nan`` / ``inf`` are no Python names, so its eval fails on the first one."""
    if isinstance(value, float) and not math.isfinite(value):
        return "nan" if math.isnan(value) else "inf"
    items = value.values() if isinstance(value, dict) else value if isinstance(value, list) else ()
    for item in items:
        found = _first_non_finite(item)
        if found:
            return found
    return None


# BFCL evals the call string; CPython's tokenizer refuses 200 nested brackets with "SyntaxError: too many
# nested parentheses". Below this many levels of lists and objects a call string always parses, so only deeper
# arguments pay for the parse that finds out.
PARSE_CHECK_DEPTH = 100


def _nesting(value: Any) -> int:
    """Levels of lists and objects in a decoded JSON value (iterative: the value may be thousands deep)."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, level = stack.pop()
        if isinstance(item, (list, dict)):
            deepest = max(deepest, level)
            stack.extend((child, level + 1) for child in (item.values() if isinstance(item, dict) else item))
    return deepest


def _source(name: Any, arguments: dict[str, Any]) -> str:
    # BFCL's layout of a decoded call (comma without a space); used only to name the error it would raise.
    return f"{name}({','.join(f'{k}={v!r}' for k, v in arguments.items())})"


def failure_text(name: Any, arguments: dict[str, Any], known: bool) -> str | None:
    """The error text BFCL's executor gives a call that cannot run, else None (the call runs on our executor).

    `known`: `name` is a method of the task's classes. Mirrors BFCL's order: the refused names first, then
    Python's own errors for the call string (syntax, the callee, then the arguments in order)."""
    try:
        source = _source(name, arguments)
    except RecursionError as exc:  # deeper than repr goes; BFCL could not even write the call string
        return f"{ERROR_PREFIX}RecursionError: {exc}"
    head = source.split("(")[0]
    if "." in head:
        head = head.split(".")[1]
    if head in BFCL_FORBIDDEN_NAMES:
        return f"{ERROR_PREFIX}Function call {head} is not allowed."
    runnable = known and all(is_valid_argument_name(k) for k in arguments) and _first_non_finite(arguments) is None
    if runnable and _nesting(arguments) < PARSE_CHECK_DEPTH:
        return None
    try:
        tree = ast.parse(source, filename="<string>", mode="eval")
    except SyntaxError as exc:  # e.g. nested too deeply for BFCL's eval
        return f"{ERROR_PREFIX}{exc}"
    except (ValueError, RecursionError, MemoryError) as exc:
        return f"{ERROR_PREFIX}{type(exc).__name__}: {exc}"
    if runnable:
        return None
    callee = tree.body.func if isinstance(tree.body, ast.Call) else tree.body
    if not known:
        root = callee
        while isinstance(root, ast.Attribute):
            root = root.value
        if isinstance(root, ast.Name):
            return f"{ERROR_PREFIX}name '{root.id}' is not defined"
    missing = _first_non_finite(arguments)
    if missing:
        return f"{ERROR_PREFIX}name '{missing}' is not defined"
    return f"{ERROR_PREFIX}'{type(name).__name__}' object is not callable"


def checker_call(name: Any, arguments: dict[str, Any], runnable: bool) -> str:
    """The call string BFCL's checker replays for this call (runnable: a validated call of a known tool)."""
    return format_call(name, arguments) if runnable else UNRUNNABLE_CALL

"""Model-facing text: the ``bfcl_qwen_fc`` system prompt, observations and BFCL's reveal message.

The system prompt is Qwen2.5's tool-calling layout (docs/release_behaviour.md §2.1) with the raw BFCL
(Gorilla-format) docs, one JSON per line, exactly as the release presents them; tool results go back
as ``<tool_response>`` blocks in a user message; a held-out function is revealed with BFCL's own
additional-function prompt.
"""

from __future__ import annotations

import json

from env_service.bfcl import DEFAULT_USER_PROMPT_FOR_ADDITIONAL_FUNCTION_PROMPTING

# Qwen2.5's function-calling layout (a model-facing protocol defined by Qwen, used as defined).
_TOOLS_HEADER = (
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>"
)
_TOOLS_FOOTER = (
    "</tools>\n\nFor each function call, return a json object with function name and arguments within "
    '<tool_call></tool_call> XML tags:\n<tool_call>\n{"name": <function-name>, "arguments": '
    "<args-json-object>}\n</tool_call>"
)

ERROR_PREFIX = "[ERROR] "


def system_prompt(tools: list[dict], suffix: str = "") -> str:
    """``bfcl_qwen_fc``: header, one ``json.dumps(doc)`` per line (ASCII-escaped, default separators), footer,
    then the train-only interface suffix (if any) after a blank line."""
    lines = [_TOOLS_HEADER, *(json.dumps(doc) for doc in tools), _TOOLS_FOOTER]
    text = "\n".join(lines)
    return f"{text}\n\n{suffix}" if suffix else text


def tool_response(result: str) -> str:
    return f"<tool_response>\n{result}\n</tool_response>\n"


def reveal_message(docs: list[dict]) -> str:
    """BFCL's prompt for newly available functions (prompting variant, as the release sends it)."""
    return DEFAULT_USER_PROMPT_FOR_ADDITIONAL_FUNCTION_PROMPTING.format(
        functions=json.dumps(docs, ensure_ascii=False)
    )


def rejected_call_message(reason: str) -> str:
    return f"{ERROR_PREFIX}Tool call rejected: {reason}"

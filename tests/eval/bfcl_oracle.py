"""BFCL as the oracle: scripted policies played through bfcl-eval's own pipeline and through the project.

BFCL side: bfcl-eval's ``QwenFCHandler`` (its multi-turn prompting loop, prompt formatting, decoder and
executor) wrapped by BFCL's ``multi_threaded_inference`` (which records an exception as an inference error),
then BFCL's eval-runner entry point ``_evaluate_single_multi_turn_entry`` (its decoding of the result and its
multi-turn checker). Only the model query is replaced: the handler's OpenAI client gets a stand-in whose
``completions.create(prompt=...)`` answers with the scripted reply, and its tokenizer a stand-in that counts
nothing (token counts only size ``max_tokens``, which a script ignores).

``bfcl_eval.constants.model_config`` imports every vendor SDK of BFCL's model registry (anthropic, cohere,
google-genai, ...), which are not installed here and play no part in the Qwen handler or the runner; when it
cannot be imported, a module holding an empty registry stands in for it. Nothing else is replaced.

Project side: the same script as a text policy through ``seal.eval.held_in.evaluate_tasks`` against a real
env service, episodes created with ``rules="official"``.

A script is a function ``(task, turn, step) -> reply text`` of the task's ground truth, the turn index and the
step index within the turn, so both sides get the same reply at the same point of the conversation. Each side
derives (turn, step) from what it was given: BFCL from its formatted prompt, the project from the messages.
"""

from __future__ import annotations

import contextlib
import io
import json
import sys
import types
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

from env_service.official import UNRUNNABLE_CALL
from env_service.tasks import Task, load_tasks

Script = Callable[[Task, int, int], str]


# --- scripted replies ----------------------------------------------------------------------------------

DONE = "Done."


def block(name: Any, arguments: Any) -> str:
    """One call in the layout BFCL's Qwen handler reads (the same bytes its prompt renders back)."""
    return f'<tool_call>\n{{"name": {json.dumps(name)}, "arguments": {json.dumps(arguments)}}}\n</tool_call>'


def gt_calls(task: Task, turn: int) -> list[tuple[str, dict[str, Any]]]:
    return [(c.name, dict(c.arguments)) for c in task.gt_calls[turn]] if turn < len(task.gt_calls) else []


def _one_per_step(calls: list[tuple[str, dict]], step: int, render: Callable[[str, dict], str] = block) -> str:
    return render(*calls[step]) if step < len(calls) else DONE


def ground_truth(task: Task, turn: int, step: int) -> str:
    return _one_per_step(gt_calls(task, turn), step)


def batched(task: Task, turn: int, step: int) -> str:
    calls = gt_calls(task, turn)
    return "\n".join(block(*c) for c in calls) if step == 0 and calls else DONE


def empty(task: Task, turn: int, step: int) -> str:
    return "I am not able to help with that."


def drop_last(task: Task, turn: int, step: int) -> str:
    return _one_per_step(gt_calls(task, turn)[:-1], step)


def extra_call(task: Task, turn: int, step: int) -> str:
    calls = gt_calls(task, turn)
    return _one_per_step(calls + calls[:1], step)


def wrong_args(task: Task, turn: int, step: int) -> str:
    calls = gt_calls(task, turn)
    if calls:
        name, args = calls[0]
        changed = {k: (v + "_x" if isinstance(v, str) else v) for k, v in args.items()}
        calls = [(name, changed if changed != args else {**args, "unexpected": 1}), *calls[1:]]
    return _one_per_step(calls, step)


def no_newlines(task: Task, turn: int, step: int) -> str:
    # <tool_call>{...}</tool_call> on one line: plain text to BFCL's Qwen handler, so the turn ends.
    return _one_per_step(gt_calls(task, turn), step, lambda n, a: block(n, a).replace("\n", ""))


def mixed_malformed(task: Task, turn: int, step: int) -> str:
    # a valid block beside one whose body is not JSON: BFCL skips the broken one and runs the valid call
    reply = ground_truth(task, turn, step)
    return reply + '\n<tool_call>\n{"name": "cd", "arguments": {"folder": \n</tool_call>' if reply != DONE else DONE


def non_object_block(task: Task, turn: int, step: int) -> str:
    # a block holding a JSON list: undecodable (the turn ends) and unrenderable in BFCL's history
    if turn == 0 and step == 0:
        return ground_truth(task, turn, step) + "\n<tool_call>\n[1, 2]\n</tool_call>"
    return ground_truth(task, turn, step)


def non_object_last_turn(task: Task, turn: int, step: int) -> str:
    # the same on the last turn's last reply: no further query follows, so nothing fails there
    if turn == len(task.gt_calls) - 1 and step == len(gt_calls(task, turn)):
        return "<tool_call>\n[1, 2]\n</tool_call>"
    return ground_truth(task, turn, step)


def missing_arguments(task: Task, turn: int, step: int) -> str:
    calls = gt_calls(task, turn)
    if step == 0 and calls:
        return f'<tool_call>\n{{"name": {json.dumps(calls[0][0])}}}\n</tool_call>'
    return _one_per_step(calls, step - 1) if calls else DONE


def partial_block(task: Task, turn: int, step: int) -> str:
    # an opening tag without its closing one: no call, the turn ends
    reply = ground_truth(task, turn, step)
    return reply.replace("\n</tool_call>", "") if reply != DONE else DONE


def early_held_out(task: Task, turn: int, step: int) -> str:
    # miss_func: call the held-out function's ground-truth use at the very start (BFCL runs it before the reveal)
    if turn == 0 and step == 0 and task.held_out:
        reveal_turn = min(task.held_out)
        names = {d["name"] for d in task.held_out[reveal_turn]}
        for t in range(reveal_turn, len(task.gt_calls)):
            for name, args in gt_calls(task, t):
                if name in names:
                    return block(name, args)
        return block(next(iter(names)), {})
    return ground_truth(task, turn, step - 1 if turn == 0 and task.held_out else step)


def recovery(task: Task, turn: int, step: int) -> str:
    # errors first (an unknown function, then a bad argument name), then the ground truth
    calls = gt_calls(task, turn)
    if not calls:
        return DONE
    if step == 0:
        return block("nonexistent_tool", {"x": 1})
    if step == 1:
        return block(calls[0][0], {"not a name": 1})
    return _one_per_step(calls, step - 2)


def step_loop(task: Task, turn: int, step: int) -> str:
    # repeats the turn's first call: BFCL force-quits after the 21st step
    calls = gt_calls(task, turn)
    return block(*calls[0]) if calls else DONE


def loop_last_turn(task: Task, turn: int, step: int) -> str:
    # the ground truth, then harmless failing calls forever on the last turn: the force-quit there leaves every
    # turn in the result, so BFCL grades it as it stands (a pass)
    calls = gt_calls(task, turn)
    if turn == len(task.gt_calls) - 1 and step >= len(calls):
        return block("nonexistent_tool", {"attempt": step})
    return ground_truth(task, turn, step)


def loop_first_turn(task: Task, turn: int, step: int) -> str:
    # the same loop on the first turn: the force-quit leaves turns out, and BFCL fails the task
    calls = gt_calls(task, turn)
    if turn == 0 and step >= len(calls):
        return block("nonexistent_tool", {"attempt": step})
    return ground_truth(task, turn, step)


def think_then_call(task: Task, turn: int, step: int) -> str:
    return "<think>\nLet me work this out.\n</think>\n\n" + ground_truth(task, turn, step)


def string_arguments(task: Task, turn: int, step: int) -> str:
    calls = gt_calls(task, turn)
    return _one_per_step(calls, step, lambda n, a: block(n, json.dumps(a)))


def non_finite(task: Task, turn: int, step: int) -> str:
    calls = gt_calls(task, turn)
    if step == 0 and calls:
        return block(calls[0][0], {**calls[0][1], "x": 1}).replace('"x": 1', '"x": NaN')
    return _one_per_step(calls, step - 1) if calls else DONE


def talk_then_call(task: Task, turn: int, step: int) -> str:
    reply = ground_truth(task, turn, step)
    return "I will do that now.\n" + reply if reply != DONE else "All done, anything else?"


def answer_without_tools(task: Task, turn: int, step: int) -> str:
    return DONE if turn % 2 else ground_truth(task, turn, step)


def unknown_only(task: Task, turn: int, step: int) -> str:
    return block("nonexistent_tool", {}) if step == 0 else DONE


def forbidden_name(task: Task, turn: int, step: int) -> str:
    return block("kill", {"pid": 1}) if step == 0 and turn == 0 else ground_truth(task, turn, step - (turn == 0))


def number_name(task: Task, turn: int, step: int) -> str:
    # a name that is a number: BFCL decodes and runs it (an error), but cannot render it in its next prompt
    return block(5, {}) if turn == 0 and step == 1 else ground_truth(task, turn, step - (turn == 0 and step > 1))


SCRIPTS: dict[str, Script] = {f.__name__: f for f in (
    ground_truth, batched, empty, drop_last, extra_call, wrong_args, no_newlines, mixed_malformed,
    non_object_block, non_object_last_turn, missing_arguments, partial_block, early_held_out, recovery,
    step_loop, loop_last_turn, loop_first_turn, think_then_call, string_arguments, non_finite, talk_then_call,
    answer_without_tools, unknown_only, forbidden_name, number_name,
)}
# Scripts whose replies BFCL's chat history keeps byte for byte (canonical blocks, no text around them), so
# its prompt and the project's transcript rendered in Qwen's chat layout must be identical at every step.
CANONICAL = ("ground_truth", "batched", "empty", "drop_last", "extra_call", "wrong_args", "step_loop",
             "answer_without_tools", "unknown_only")


# --- where a conversation stands ------------------------------------------------------------------------

TOOL_RESPONSE = "<tool_response>"


def position(roles_contents: list[tuple[str, str]]) -> tuple[int, int]:
    """(turn, step): user messages that are not tool results open a turn; assistant replies since count steps."""
    turn, step = -1, 0
    for role, content in roles_contents:
        if role == "user" and not content.startswith(TOOL_RESPONSE):
            turn, step = turn + 1, 0
        elif role == "assistant":
            step += 1
    return turn, step


def chatml_messages(prompt: str) -> list[tuple[str, str]]:
    """The (role, content) blocks of a ChatML prompt (BFCL's formatted Qwen prompt), the open reply dropped."""
    parts = prompt.split("<|im_start|>")[1:]
    out = []
    for part in parts:
        role, _, content = part.partition("\n")
        if content.endswith("<|im_end|>\n"):
            out.append((role, content[: -len("<|im_end|>\n")]))
    return out


def render_chatml(messages: list[dict[str, str]]) -> str:
    """Messages in Qwen's chat layout (what its chat template makes of plain-text messages) + the reply prompt."""
    return "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages) + "<|im_start|>assistant\n"


# --- BFCL side ----------------------------------------------------------------------------------------


def _bfcl_modules() -> SimpleNamespace:
    try:
        import bfcl_eval.constants.model_config  # noqa: F401
    except ImportError:  # vendor SDKs of the model registry are not installed (module docstring)
        stub = types.ModuleType("bfcl_eval.constants.model_config")
        stub.MODEL_CONFIG_MAPPING = {}
        sys.modules["bfcl_eval.constants.model_config"] = stub
    from bfcl_eval._llm_response_generation import multi_threaded_inference
    from bfcl_eval.constants.category_mapping import VERSION_PREFIX
    from bfcl_eval.constants.eval_config import POSSIBLE_ANSWER_PATH, PROMPT_PATH
    from bfcl_eval.eval_checker.eval_runner import _evaluate_single_multi_turn_entry
    from bfcl_eval.eval_checker.multi_turn_eval import multi_turn_utils
    from bfcl_eval.model_handler.local_inference.qwen_fc import QwenFCHandler
    from bfcl_eval.utils import (
        add_language_specific_hint_to_function_doc,
        populate_test_cases_with_predefined_functions,
        process_agentic_test_case,
    )

    return SimpleNamespace(inference=multi_threaded_inference, evaluate=_evaluate_single_multi_turn_entry,
                           utils=multi_turn_utils, handler=QwenFCHandler, prefix=VERSION_PREFIX,
                           prompt_path=PROMPT_PATH, answer_path=POSSIBLE_ANSWER_PATH,
                           process_agentic=process_agentic_test_case,
                           populate=populate_test_cases_with_predefined_functions,
                           add_hint=add_language_specific_hint_to_function_doc)


@dataclass
class BfclRun:
    valid: bool
    error_type: str | None
    prompts: list[str]


class _ScriptedCompletions:
    """Stands in for the OpenAI client's ``completions``: the scripted reply at the prompt's position."""

    def __init__(self, script: Script, task: Task, prompts: list[str]):
        self.script, self.task, self.prompts = script, task, prompts

    def create(self, *, prompt: str, **_: Any) -> Any:
        self.prompts.append(prompt)
        turn, step = position(chatml_messages(prompt))
        text = self.script(self.task, turn, step)
        return SimpleNamespace(choices=[SimpleNamespace(text=text)],
                               usage=SimpleNamespace(prompt_tokens=0, completion_tokens=0))


class Bfcl:
    """bfcl-eval's Qwen FC multi-turn pipeline with scripted model replies."""

    def __init__(self) -> None:
        self.m = _bfcl_modules()
        self.handler: Any = None
        self.entries: dict[str, dict] = {}
        self._raw: dict[str, dict[str, str]] = {}
        self._answers: dict[str, dict[str, list]] = {}

    def entry(self, task_id: str) -> dict:
        """The test entry as BFCL's ``load_dataset_entry`` builds it for a multi-turn category (its own steps:
        the data file, then ``populate_test_cases_with_predefined_functions`` and the language hint), for this
        one task only."""
        if task_id not in self.entries:
            category = task_id.rsplit("_", 1)[0]
            if category not in self._raw:
                self._raw[category] = self._lines(self.m.prompt_path / f"{self.m.prefix}_{category}.json")
                self._answers[category] = {k: json.loads(v)["ground_truth"] for k, v in
                                           self._lines(self.m.answer_path / f"{self.m.prefix}_{category}.json").items()}
            entries = [json.loads(self._raw[category][task_id])]
            entries = self.m.populate(self.m.process_agentic(entries))
            self.m.add_hint(entries)
            self.entries[task_id] = entries[0]
        return self.entries[task_id]

    def answer(self, task_id: str) -> list:
        self.entry(task_id)
        return self._answers[task_id.rsplit("_", 1)[0]][task_id]

    @staticmethod
    def _lines(path: Any) -> dict[str, str]:
        with open(path, encoding="utf-8") as fh:
            return {json.loads(line)["id"]: line for line in fh if line.strip()}

    def run(self, script: Script, task_id: str) -> BfclRun:
        if self.handler is None:  # one handler: building one builds an OpenAI client (an SSL context)
            self.handler = self.m.handler("oracle", 0.001, "oracle", False)
            self.handler.tokenizer = SimpleNamespace(tokenize=lambda text: [])
            self.handler.max_context_length = 1 << 30
            self.handler.model_path_or_id = "oracle"
        handler = self.handler
        # BFCL names its executor instances after the model: a fresh name per run keeps runs apart
        name = f"oracle_{uuid.uuid4().hex[:12]}"
        handler.model_name_underline_replaced = name
        prompts: list[str] = []
        handler.client = SimpleNamespace(completions=_ScriptedCompletions(script, load_tasks()[task_id], prompts))
        try:
            with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
                # shallow copies: the prompting loop and the runner replace top-level keys only
                result = self.m.inference(handler, dict(self.entry(task_id)), False, True)
                verdict = self.m.evaluate(handler, task_id, result["result"], self.answer(task_id),
                                          dict(self.entry(task_id)), f"{name}_eval", task_id.rsplit("_", 1)[0])
        finally:  # BFCL keeps each run's instances in its executor's module globals
            for key in [k for k in vars(self.m.utils) if k.startswith(name)]:
                delattr(self.m.utils, key)
        error = verdict.get("error") or {}
        return BfclRun(bool(verdict["valid"]), error.get("error_type"), prompts)


def unrunnable_name_is_undefined(bfcl: Bfcl) -> bool:
    """The checker's placeholder call names nothing in BFCL's executor namespace or Python's builtins."""
    import builtins

    name = UNRUNNABLE_CALL.split("(")[0]
    return name not in vars(bfcl.m.utils) and not hasattr(builtins, name)


# --- project side -------------------------------------------------------------------------------------


def project_policy(script: Script, prompts: dict[str, list[str]] | None = None):
    """The script as a text policy for ``seal.eval.held_in.evaluate_tasks`` (records each rendered prompt)."""
    from seal.eval.policies import Policy

    def factory(task_id: str):
        task = load_tasks()[task_id]
        seen = prompts.setdefault(task_id, []) if prompts is not None else None

        async def agent(messages: list[dict[str, str]]) -> str:
            if seen is not None:
                seen.append(render_chatml(messages))
            turn, step = position([(m["role"], m["content"]) for m in messages])
            return script(task, turn, step)

        return agent

    return Policy(spec="oracle", kind="text", agent_factory=factory)

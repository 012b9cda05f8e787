"""One episode: the state machine of a BFCL multi-turn task played by a model (docs/release_behaviour.md §3–4).

* ``create``: system prompt (``bfcl_qwen_fc`` + the train-only interface suffix) and the first user turn.
* ``step(content)``: the raw assistant text is parsed; a malformed message is rejected as a whole; calls to
  tools that are not available now are rejected as a whole; otherwise every call executes on this episode's own
  BFCL instances and the results come back as ``<tool_response>`` blocks. A message without calls ends the
  turn: the next user turn follows (or BFCL's reveal message for a miss_func held-out turn), and after the last
  turn the episode is done. A step limit (per episode or per turn) cuts the episode off.
* ``evaluate``: graded once, then frozen.
"""

from __future__ import annotations

import copy
import time
from typing import Any

from env_service import interface as iface
from env_service import official, vocab
from env_service.budget import BudgetExceeded, budget_message
from env_service.calls import is_valid_argument_name
from env_service.config import EpisodeConfig, StepLimit
from env_service.executor import ToolExecutor
from env_service.grading import grade, over_budget_result
from env_service.parser import echo, parse_tool_calls
from env_service.prompts import rejected_call_message, reveal_message, system_prompt, tool_response
from env_service.rules import OFFICIAL, RELEASE, check_rules
from env_service.tasks import Task
from env_service.tool_errors import is_error_result
from env_service.trajectory import AcceptedCall, Step, Turn

_PYTHON_NOTE = " Note that the provided function is in Python 3 syntax."


class EpisodeStateError(Exception):
    """A request that the episode's state does not allow (stepping a finished episode): HTTP 409."""


class Episode:
    def __init__(
        self,
        episode_id: str,
        task: Task,
        mode: str,
        interface: iface.Interface,
        config: EpisodeConfig,
        step_limit: StepLimit | None = None,
        rules: str = RELEASE,
    ) -> None:
        self.id = episode_id
        self.rules = check_rules(rules)
        self.inference_error = False  # official: BFCL's next model query would have failed
        self.task = task
        self.mode = mode
        self.interface = interface
        self.config = config
        self.step_limit = step_limit or config.step_limit
        self.executor = ToolExecutor(task.involved_classes, task.initial_config, task.long_context)
        self.tools = [copy.deepcopy(d) for d in task.tools]  # docs available now (raw)
        self.available = {d["name"] for d in self.tools}
        self.turn = 0
        self.turns: list[Turn] = [Turn()]
        self.steps_total = 0
        self.steps_in_turn = 0
        self.done = False
        self.completed = False
        self.end_reason: str | None = None
        self.result: dict[str, Any] | None = None
        self.over_budget: tuple[str, str] | None = None  # (limit, detail) an action broke (env_service/budget.py)
        self.last_access = time.monotonic()

    # --- rendering -------------------------------------------------------------------------------------
    def presented_tools(self, docs: list[dict] | None = None) -> list[dict]:
        docs = self.tools if docs is None else docs
        if self.rules == OFFICIAL:  # the prompt's tool list never changes (revealed docs come in a message)
            return official.prompt_tools(self.task.tools if docs is self.tools else docs)
        return iface.annotate_tools(docs, self.interface.schema)

    def initial_messages(self) -> list[dict[str, str]]:
        suffix = iface.render_system_suffix(self.interface)
        return [
            {"role": "system", "content": system_prompt(self.presented_tools(), suffix)},
            {"role": "user", "content": self.task.questions[0]},
        ]

    def _hint(self, kind: str, message: str, function_name: str | None = None) -> str:
        if not self.interface.error_feedback:
            return ""
        hint = iface.error_feedback(kind, message, function_name, sorted(self.available))
        return f"\n{hint}" if hint else ""

    # --- stepping --------------------------------------------------------------------------------------
    def step(self, content: str) -> dict[str, Any]:
        if self.done or self.result is not None:
            raise EpisodeStateError("episode is finished; no more steps")
        self.steps_total += 1
        if self.rules == OFFICIAL:
            return self._step_official(content)
        self.steps_in_turn += 1
        parsed = parse_tool_calls(content)
        turn = self.turns[self.turn]
        observation: str | None
        error_type: str | None = None

        if parsed.error:
            error_type = vocab.PARSE_ERROR
            turn.steps.append(Step(vocab.PARSE_ERROR, error=parsed.error))
            observation = rejected_call_message(parsed.error) + self._hint(vocab.PARSE_ERROR, parsed.error)
        elif parsed.calls:
            try:
                self.config.budget.check_calls(len(parsed.calls))
                observation, error_type = self._execute(parsed.calls, turn)
            except BudgetExceeded as exc:
                return self.end_over_budget(exc, [c["name"] for c in parsed.calls])
        else:
            turn.steps.append(Step("text"))
            observation = self._advance_turn()

        if not self.done and self._over_step_limit():
            self.done, self.end_reason, observation = True, "step_limit", None
        return {
            "observation": None if observation is None else {"role": "user", "content": observation},
            "done": self.done,
            "turn": self.turn,
            "info": {
                "error_type": error_type,
                "end_reason": self.end_reason,
                "steps": self.steps_total,
            },
        }

    def _execute(self, calls: list[dict[str, Any]], turn: Turn) -> tuple[str, str | None]:
        names = [c["name"] for c in calls]
        for call in calls:
            name = call["name"]
            callable_now = (
                name in self.available if self.config.strict_availability else self.executor.knows(name)
            )
            # Only names of public BFCL methods ever reach the executor (and, later, BFCL's checker).
            if not callable_now or not self.executor.knows(name):
                reason = f"'{echo(name)}' is not an available tool"
                turn.steps.append(Step(vocab.UNAVAILABLE_TOOL, attempted=names, error=reason))
                return rejected_call_message(reason) + self._hint(vocab.UNAVAILABLE_TOOL, reason, name), (
                    vocab.UNAVAILABLE_TOOL
                )
            bad = [k for k in call["arguments"] if not is_valid_argument_name(k)]
            if bad:
                reason = f"argument name {echo(bad[0])!r} of '{name}' is not a valid identifier"
                turn.steps.append(Step(vocab.PARSE_ERROR, attempted=names, error=reason))
                return rejected_call_message(reason) + self._hint(
                    vocab.PARSE_ERROR, reason, name
                ), vocab.PARSE_ERROR
        accepted, parts, error_type = [], [], None
        reply_left = self.config.budget.reply_bytes
        for call in calls:
            result = self.executor.call(call["name"], call["arguments"], reply_left)
            reply_left -= len(result)
            failed = is_error_result(result)
            accepted.append(AcceptedCall(call["name"], call["arguments"], result, failed))
            part = tool_response(result)
            if failed:
                error_type = vocab.TOOL_ERROR
                hint = self._hint(vocab.TOOL_ERROR, result, call["name"])
                if hint:  # after the block it explains, on lines of its own
                    part += hint.lstrip("\n") + "\n"
            parts.append(part)
        turn.steps.append(Step("calls", calls=accepted, attempted=names))
        return "".join(parts), error_type

    def end_over_budget(self, exc: BudgetExceeded, attempted: list[str] | None = None) -> dict[str, Any]:
        """End the episode after an action over the cost budget; returns the step reply the model gets."""
        if self.over_budget is None:  # idempotent: a rebuilt episode may be ended twice
            self.done, self.end_reason, self.over_budget = True, "budget_exceeded", (exc.limit, exc.detail)
            self.turns[self.turn].steps.append(Step(vocab.BUDGET_EXCEEDED, attempted=attempted or [], error=exc.detail))
            self.executor = None  # its instances may hold what the action allocated
        return {
            "observation": {"role": "user", "content": budget_message(exc)},
            "done": True,
            "turn": self.turn,
            "info": {"error_type": vocab.BUDGET_EXCEEDED, "end_reason": self.end_reason, "steps": self.steps_total},
        }

    def _step_official(self, content: str) -> dict[str, Any]:
        """One reply under BFCL's rules (env_service.official): decoded calls run, anything else ends the turn."""
        decoded = official.decode(content)
        turn = self.turns[self.turn]
        observation: str | None
        error_type: str | None = None
        if decoded.error or not decoded.calls:
            error_type = vocab.PARSE_ERROR if decoded.error else None
            turn.steps.append(Step(vocab.PARSE_ERROR, error=decoded.error) if decoded.error else Step("text"))
            observation = self._advance_turn()
        else:
            attempted = [str(n) for n, _ in decoded.calls]
            try:  # the same cost budget as under the release rules
                self.config.budget.check_calls(len(decoded.calls))
                observation, error_type = self._execute_official(decoded.calls, turn, attempted)
            except BudgetExceeded as exc:
                return self.end_over_budget(exc, attempted)
            self.steps_in_turn += 1
            if self.steps_in_turn > official.MAXIMUM_STEP_LIMIT:
                self.done, self.end_reason, observation = True, "force_quit", None
        if decoded.breaks_history and not self.done:
            self.done, self.end_reason, observation = True, "inference_error", None
            self.inference_error = True
        return {
            "observation": None if observation is None else {"role": "user", "content": observation},
            "done": self.done,
            "turn": self.turn,
            "info": {"error_type": error_type, "end_reason": self.end_reason, "steps": self.steps_total},
        }

    def _execute_official(self, calls: list[tuple[Any, Any]], turn: Turn, attempted: list[str]
                          ) -> tuple[str, str | None]:
        """Run one decoded reply's calls as BFCL does: every call runs or gets the error text BFCL's eval would
        give; the results come back in one message. Raises BudgetExceeded like ``_execute``."""
        accepted, results, checker, rejected, error_type = [], [], [], [], None
        reply_left = self.config.budget.reply_bytes
        for name, arguments in calls:
            known = isinstance(name, str) and self.executor.knows(name)
            result = official.failure_text(name, arguments, known)
            runnable = result is None
            if runnable:
                result = self.executor.call(name, arguments, reply_left)
                reply_left -= len(result)
                accepted.append(AcceptedCall(name, arguments, result, is_error_result(result)))
            else:  # what the release rules would have refused: evidence for the diagnosis, not for the verdict
                rejected.append(vocab.PARSE_ERROR if known else vocab.UNAVAILABLE_TOOL)
            if is_error_result(result):
                error_type = vocab.TOOL_ERROR
            results.append(result)
            checker.append(official.checker_call(name, arguments, runnable))
        turn.steps.append(Step("calls", calls=accepted, attempted=attempted, checker_calls=checker, rejected=rejected))
        return official.tool_responses(results), error_type

    def _advance_turn(self) -> str | None:
        self.turn += 1
        self.steps_in_turn = 0
        if self.turn >= self.task.num_turns:
            self.turn = self.task.num_turns - 1  # stays on the last turn index
            self.done, self.completed, self.end_reason = True, True, "completed"
            return None
        self.turns.append(Turn())
        revealed = self.task.held_out.get(self.turn)
        if revealed and self.rules == OFFICIAL:
            return official.reveal_message(revealed)
        if revealed:
            docs = [copy.deepcopy(d) for d in revealed if d["name"] not in self.available]
            self.tools.extend(docs)
            self.available.update(d["name"] for d in docs)
            # φ_schema annotates revealed docs too, unless Ω asks for the release's raw ones.
            raw = self.interface.schema.skip_revealed
            shown = [copy.deepcopy(d) for d in docs] if raw else self.presented_tools(docs)
            if self.config.release_reveal_note:
                for doc in shown:
                    doc["description"] = doc.get("description", "") + _PYTHON_NOTE
            return reveal_message(shown)
        return self.task.questions[self.turn]

    def _over_step_limit(self) -> bool:
        used = self.steps_total if self.step_limit.scope == "episode" else self.steps_in_turn
        return used >= self.step_limit.max_steps

    # --- grading ---------------------------------------------------------------------------------------
    def evaluate(self) -> dict[str, Any]:
        """Grade once; later calls return the same result and the episode takes no more steps."""
        if self.result is None:
            self.done = True
            started = time.perf_counter()
            try:
                self.result = grade(self.task, self.turns, self.completed, self.over_budget is not None)
            except BudgetExceeded as exc:
                self.result = over_budget_result(self.task, self.turns, self.completed, exc.detail)
            if self.inference_error:  # BFCL records the task as an inference error: a failure
                self.result["accuracy"] = 0.0
                self.result["official"] = {"valid": False, "error_type": "multi_turn:inference_error",
                                           "error_message": "BFCL's handler cannot render a reply of this "
                                           "episode into its next prompt", "consistent_with_turns": True}
            self.result["grade_ms"] = (time.perf_counter() - started) * 1000
            self.result["end_reason"] = self.end_reason or "evaluated_early"
            self.result["steps"] = self.steps_total
            self.executor = None  # the live instances are no longer needed
        return self.result

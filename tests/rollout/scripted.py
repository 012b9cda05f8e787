"""A scripted env service and model for the episode-driver tests (token level here, text level in tests/eval)."""

from __future__ import annotations

import asyncio
import itertools

from env_service.protocol import CreateReply, EvaluateReply, StepReply
from seal.models.qwen25 import EOS_TOKEN_ID
from seal.rollout.types import Generation, SamplingParams

SYSTEM = "# Tools\n\nYou may call one or more functions.\n<tools>\n{\"name\": \"ls\"}\n</tools>"
USER = "List the files, then tell me how many there are."


class ScriptedEnv:
    """Stands in for EnvClient (returning the protocol's reply models, as EnvClient does). Each episode replays
    `observations` (None = the step ends the episode)."""

    def __init__(self, observations, step_faults=(), create_faults=(), eval_result=None):
        self.observations = list(observations)
        self.step_faults = list(step_faults)
        self.create_faults = list(create_faults)
        self.eval_result = eval_result or {
            "accuracy": 1.0, "progress": 1.0, "progress_with_irrelevance": 1.0, "completed": True,
            "failure_tags": ["pass"], "paper_labels": ["pass"], "turns": [], "task_id": "t", "category": "base",
            "num_turns": 2, "turns_reached": 2, "grade_ms": 1.0, "end_reason": "completed", "steps": 2,
            "counts": {"passed": 1, "scorable": 1, "passed_irrelevance": 0, "irrelevance": 0},
            "official": {"valid": True, "error_type": None, "error_message": None, "consistent_with_turns": True}}
        self.ids = itertools.count()
        self.live: dict[str, list] = {}
        self.created: list[str] = []
        self.deleted: list[str] = []
        self.steps: list[tuple[str, str]] = []
        self.evaluated: list[str] = []

    async def create(self, task_id, mode="train", interface=None, episode_id=None):
        if self.create_faults:
            raise self.create_faults.pop(0)
        eid = f"ep{next(self.ids)}"
        self.live[eid] = list(self.observations)
        self.created.append(eid)
        return CreateReply.model_validate({
            "episode_id": eid, "tools": [],
            "info": {"category": "base", "num_turns": 2, "mode": mode, "interface_version": 0,
                     "step_limit": {"scope": "episode", "max_steps": 20}},
            "messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": USER}]})

    async def step(self, eid, content):
        self.steps.append((eid, content))
        if self.step_faults:
            fault = self.step_faults.pop(0)
            if fault is not None:
                raise fault
        script = self.live[eid]
        obs = script.pop(0) if script else "next"
        steps = sum(e == eid for e, _ in self.steps)
        if obs is None:
            return StepReply.model_validate({"observation": None, "done": True, "turn": 2,
                                             "info": {"error_type": None, "end_reason": "completed", "steps": steps}})
        return StepReply.model_validate({"observation": {"role": "user", "content": obs}, "done": False, "turn": 1,
                                         "info": {"error_type": None, "end_reason": None, "steps": steps}})

    async def evaluate(self, eid):
        self.evaluated.append(eid)
        return EvaluateReply.model_validate(self.eval_result)

    async def delete(self, eid):
        self.deleted.append(eid)
        self.live.pop(eid)


class ScriptedModel:
    """`generate` returning fixed token lists in order (cycling), recording every prompt it saw."""

    def __init__(self, outputs, finish=None, logprobs=False, delay=0.0):
        self.outputs = [list(o) for o in outputs]
        self.finish = finish
        self.logprobs = logprobs
        self.delay = delay
        self.prompts: list[list[int]] = []
        self.params: list[SamplingParams] = []
        self.calls = 0

    async def __call__(self, prompt_ids, params):
        self.prompts.append(list(prompt_ids))
        self.params.append(params)
        ids = self.outputs[self.calls % len(self.outputs)]
        self.calls += 1
        if self.delay:
            await asyncio.sleep(self.delay)
        finish = self.finish or ("stop" if ids and ids[-1] == EOS_TOKEN_ID else "length")
        lps = [-0.5 - 0.01 * i for i in range(len(ids))] if self.logprobs else None
        return Generation(token_ids=ids, finish_reason=finish, logprobs=lps)

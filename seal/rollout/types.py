"""Result and parameter types of the agent loop (one env-service episode = one `Rollout`)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, fields
from typing import Any, Literal, Protocol

from seal.core.record import EpisodeRecord


@dataclass(frozen=True)
class SamplingParams:
    """Per-call sampling settings handed to the `generate` backend.

    temperature / top_p / top_k: release recipe: training 1.0 / 1.0 / -1, validation greedy
        (temperature 0, top_k -1, top_p 1.0).
    max_tokens: tokens this call may produce. The agent loop always fills it in (the per-call limit,
        release `rollout.response_length` = 4096, lowered when the context is nearly full), so a
        backend can trust it.
    seed: optional backend seed (ours; for reproducible tests).
    """

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    max_tokens: int | None = None
    seed: int | None = None


@dataclass(frozen=True)
class Generation:
    """What a `generate` backend returns for one call.

    token_ids: the sampled tokens exactly as produced, including the end-of-turn token when the model
        sampled it (finish_reason "stop"). Never re-tokenised text.
    finish_reason: "stop" (end-of-turn / stop token) or "length" (hit max_tokens).
    logprobs: one log-probability per token in `token_ids`, or None when the backend has none.
    """

    token_ids: list[int]
    finish_reason: Literal["stop", "length"]
    logprobs: list[float] | None = None


class GenerateFn(Protocol):
    """`async def generate(prompt_ids, params) -> Generation` (vLLM server, HF model, or a script)."""

    def __call__(self, prompt_ids: list[int], params: SamplingParams) -> Awaitable[Generation]: ...


@dataclass(frozen=True)
class RolloutLimits:
    """Length limits of one episode (release values; docs/agent_loop.md, Limits).

    max_prompt_length: tokens of the initial prompt (chat template of [system, user] + generation
        prompt). Release `data.max_prompt_length` = 8192; the release crashed the step when exceeded,
        we return the sample `excluded` (reason "prompt_too_long").
    max_response_length: tokens of the whole interleaved response (model + observation tokens).
        Release `data.max_response_length` = 4096: longer responses keep their head, the tail is
        dropped and the sample is flagged `truncated`; the reward still grades the full episode.
    max_model_len: context window. Release 16384. The loop stops calling the model once
        prompt + response >= max_model_len - max_tokens_per_call (12288 with release values).
    max_tokens_per_call: tokens one model call may produce. Release `rollout.response_length` = 4096.
    max_model_calls: client-side safety bound on model calls per episode (ours). The service enforces
        the release's step limit itself (it answers done=True); this bound only guards against a
        service that never ends an episode. Default 64 > any service step limit in our recipes.
    max_observation_tokens: an observation whose template increment is longer than this is cut
        (release `max_env_len` = 4096, the same proportional character cut plus a marker); None
        disables the cut (ours).
    """

    max_prompt_length: int = 8192
    max_response_length: int = 4096
    max_model_len: int = 16384
    max_tokens_per_call: int = 4096
    max_model_calls: int = 64
    max_observation_tokens: int | None = 4096
    # A plain record: its rules (each limit positive, a call shorter than the context, an observation cut above
    # 200 tokens) are the recipe's (seal.recipe.schema.RolloutConfig / DataConfig), stated once there; the
    # engines build it from a validated recipe (seal.recipe.derived.rollout_limits).


RewardFn = Callable[[dict], float]


def accuracy_reward(eval_result: dict) -> float:
    """Default reward: the official BFCL multi-turn verdict (0.0 or 1.0), as in the paper."""
    return float(eval_result["accuracy"])


@dataclass
class Rollout:
    """One finished (or excluded) episode, token-exact.

    Sequences: `prompt_ids` is the initial prompt; `response_ids` the interleaved model and
    observation tokens after it; `response_mask[i]` is 1 exactly when `response_ids[i]` was sampled
    by the model (including a sampled end-of-turn token) and 0 for observation/template tokens;
    `response_logprobs` is aligned with `response_ids` (0.0 on unsampled tokens) or None.

    Flags: `excluded` samples must not be trained on or scored (reason in `exclude_reason`:
    "prompt_too_long", "infrastructure", "env_rejected:<code>", "env_protocol"); `truncated` means the
    response was cut to `max_response_length`. `stop_reason`: "done" (service ended the episode),
    "max_model_calls", "context_limit", or "excluded".
    """

    task_id: str
    mode: str
    prompt_ids: list[int] = field(default_factory=list)
    response_ids: list[int] = field(default_factory=list)
    response_mask: list[int] = field(default_factory=list)
    response_logprobs: list[float] | None = None
    reward: float = 0.0
    accuracy: float | None = None
    progress: float | None = None
    progress_with_irrelevance: float | None = None
    failure_tags: list[str] = field(default_factory=list)
    paper_labels: list[str] = field(default_factory=list)
    category: str | None = None
    interface_version: Any = None
    num_turns: int | None = None
    num_model_calls: int = 0
    excluded: bool = False
    exclude_reason: str | None = None
    truncated: bool = False
    stop_reason: str = "done"
    completed: bool | None = None
    episode_id: str | None = None
    attempts: int = 1
    messages: list[dict] = field(default_factory=list)
    eval_result: dict | None = None
    # Seconds spent awaiting the model / the env service, and in the loop's own token bookkeeping.
    model_time_s: float = 0.0
    env_time_s: float = 0.0
    loop_time_s: float = 0.0

    def record(self) -> EpisodeRecord:
        """What the SEAL method reads of this episode (`seal.core.record`): the one place it is built."""
        # Every record field has its namesake here; the record normalises them (tags to tuples, a missing
        # category derived from the task id).
        return EpisodeRecord(**{f.name: getattr(self, f.name) for f in fields(EpisodeRecord)})

    def extras(self) -> dict:
        """Per-sample fields the trainer carries next to the tensors: the episode's record
        (`record().to_dict()`, read back with `EpisodeRecord.from_dict`) plus fields for logs."""
        return self.record().to_dict() | {
            "progress": self.progress,
            "interface_version": self.interface_version,
            "num_model_calls": self.num_model_calls,
            "num_turns": self.num_turns,
            "truncated": self.truncated,
            "stop_reason": self.stop_reason,
            "messages": self.messages,
        }

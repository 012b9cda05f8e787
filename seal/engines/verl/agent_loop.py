"""verl agent loop `seal_bfcl`: one env-service episode per sample, token-exact (seal.rollout.episode).

verl's agent-loop workers (Ray actors, one event loop each) instantiate `SealBfclAgentLoop` once per
sample and await `run(sampling_params, **row)`, where `row` is the dataset row (our parquet:
`extra_info.task_id`, `data_source` = category, ...) plus verl's `uid`, `session_id`, `global_steps`
and, from our trainer mode, `seal_feed` (`EpisodeFeed` as JSON: episode mode, the interface Ω_t and
the training progress for the reward). `run` drives `seal.rollout.episode.run_episode` with a `generate`
adapter over verl's LLM server client (token ids in, token ids + log-probs out: vLLM's async server)
and returns an `AgentLoopOutput`:

    prompt_ids / response_ids / response_mask / response_logprobs   the Rollout's, unchanged
    reward_score        the episode reward (`seal.reward` on the evaluate reply); verl puts it on the
                        last response token (`rm_scores`), so verl's reward loop is not used
    extra_fields        Rollout.extras() without the transcript (task_id, category, failure_tags,
                        paper_labels, accuracy, progress, excluded, interface_version, ...), plus
                        `min/max_global_steps` (verl's staleness bookkeeping) and
                        `reward_extra_info` {acc, category, task_id, excluded} for verl's validation
                        table

Excluded episodes (seal.rollout.types.Rollout.excluded) and episodes without any response token come back
as a well-formed placeholder (one end-of-turn token, mask 0, reward 0) flagged `excluded` in the
extras: verl cannot batch an empty response, and our trainer mode keeps them out of GRPO groups.

Per worker process and event loop, one `EnvClient` (pooled connections, several env URLs = several
replicas) and one semaphore (`rollout.concurrency` split over the agent-loop workers) are shared by all
episodes.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from functools import partial
from typing import Any
from uuid import uuid4

from omegaconf import DictConfig

# The submodule, not the package: this module may be imported by the plugin's post-import hook while
# the package `verl.experimental.agent_loop` is still initialising.
from verl.experimental.agent_loop.agent_loop import AgentLoopBase, AgentLoopMetrics, AgentLoopOutput, register

from seal import recipe as C
from seal.core.record import EpisodeRecord
from seal.core.reward import RewardConfig, compute_reward
from seal.engines.verl.config import AGENT_LOOP_NAME
from seal.rollout.client import EnvClient
from seal.rollout.codec import ChatCodec
from seal.rollout.episode import run_episode
from seal.rollout.types import Generation, Rollout, RolloutLimits, SamplingParams
from seal.rollout.vllm_generation import finish_reason, model_stop_token_ids, sampling_fields

log = logging.getLogger(__name__)

FEED_KEY = "seal_feed"  # dataset-row key the trainer mode attaches to every batch it submits
# reward_extra_info key of an evaluation episode's tokens (JSON text: verl's validation metrics skip strings); the
# trainer keeps them in `<run>/validation/step_<N>.jsonl` (`SealTrainer.validation_metrics`)
EPISODE_TOKENS_KEY = "episode_tokens"
EPISODE_MODES = ("train", "eval")
# Extras that stay in the worker: the transcript is large and the trainer does not need it.
DROPPED_EXTRAS = ("messages",)


class AgentLoopConfigError(RuntimeError):
    """The verl config lacks what the seal agent loop needs (seal.recipe from seal.engines.verl.config)."""


@dataclass(frozen=True)
class EpisodeFeed:
    """What the trainer mode sends with a batch: how to run its episodes.

    mode: "train" (Ω allowed) or "eval" (validation: raw interface; the service refuses Ω).
    interface: Ω_t for training episodes, None for the raw interface.
    training_progress: fraction of training done, in [0, 1] (reward modes with a decaying cap).
    """

    mode: str = "eval"
    interface: dict | None = None
    training_progress: float = 0.0

    def __post_init__(self) -> None:
        if self.mode not in EPISODE_MODES:
            raise ValueError(f"episode mode must be one of {EPISODE_MODES}, got {self.mode!r}")
        if self.mode == "eval" and self.interface:
            raise ValueError("evaluation episodes never get an interface")
        if not (math.isfinite(self.training_progress) and 0.0 <= self.training_progress <= 1.0):
            raise ValueError(f"training_progress must lie in [0, 1], got {self.training_progress}")

    def to_json(self) -> str:
        return json.dumps({"mode": self.mode, "interface": self.interface,
                           "training_progress": self.training_progress}, sort_keys=True)

    @classmethod
    def from_value(cls, value: Any) -> EpisodeFeed | None:
        """From the row value (JSON text, a mapping, or None = no feed)."""
        if value is None:
            return None
        data = json.loads(value) if isinstance(value, (str, bytes)) else dict(value)
        return cls(mode=str(data.get("mode", "eval")), interface=data.get("interface"),
                   training_progress=float(data.get("training_progress", 0.0)))


@dataclass(frozen=True)
class LoopSettings:
    """The agent loop's knobs, read from the recipe inside the verl config (`seal.recipe`)."""

    env_urls: tuple[str, ...]
    timeout_s: float
    max_retries: int
    max_restarts: int
    limits: RolloutLimits
    reward_cfg: RewardConfig
    concurrency_per_worker: int
    check_template: bool = False

    @classmethod
    def from_verl_config(cls, config: DictConfig) -> LoopSettings:
        recipe = config.get("seal", {}).get("recipe") if isinstance(config, DictConfig) else None
        if recipe is None:
            raise AgentLoopConfigError(
                f"the {AGENT_LOOP_NAME!r} agent loop needs the recipe under `seal.recipe` in the verl config; "
                "build the config with seal.engines.verl.config.to_verl_config")
        workers = int(config.actor_rollout_ref.rollout.agent.num_workers)
        recipe = C.from_container(recipe)
        return cls(
            env_urls=tuple(recipe.env.urls),
            timeout_s=recipe.env.timeout_s,
            max_retries=recipe.env.max_retries,
            max_restarts=recipe.env.max_restarts,
            limits=C.rollout_limits(recipe),
            reward_cfg=recipe.seal.reward,
            concurrency_per_worker=max(1, -(-recipe.rollout.concurrency // max(workers, 1))),
            check_template=recipe.rollout.check_template,
        )


class _WorkerResources:
    """What all episodes of one worker event loop share: settings, env client, concurrency gate."""

    def __init__(self, settings: LoopSettings):
        self.settings = settings
        self.client = EnvClient(list(settings.env_urls), timeout=settings.timeout_s,
                                max_retries=settings.max_retries,
                                max_connections=max(32, 2 * settings.concurrency_per_worker))
        self.gate = asyncio.Semaphore(settings.concurrency_per_worker)
        self._codecs: dict[int, tuple[Any, ChatCodec]] = {}
        self._stops: dict[str, list[int]] = {}

    def stop_ids(self, model_path: str, tokenizer: Any) -> list[int]:
        """The model's stop tokens (`model_stop_token_ids`: the tokenizer's eos and the generation config's eos
        ids, as the local engine and the `vllm:` policy stop), read once per model."""
        if model_path not in self._stops:
            self._stops[model_path] = model_stop_token_ids(model_path, tokenizer)
        return self._stops[model_path]

    def checking_codec(self, tokenizer: Any) -> ChatCodec:
        """`tokenizer`'s codec with the full-render check on, built once per tokenizer."""
        entry = self._codecs.get(id(tokenizer))
        if entry is None or entry[0] is not tokenizer:
            entry = self._codecs[id(tokenizer)] = (tokenizer, ChatCodec(tokenizer, check_full_render=True))
        return entry[1]


# id(event loop) -> (loop, settings, resources). A worker has one loop; tests may run several.
_RESOURCES: dict[int, tuple[asyncio.AbstractEventLoop, LoopSettings, _WorkerResources]] = {}


def _resources_for(config: DictConfig) -> _WorkerResources:
    loop = asyncio.get_running_loop()
    settings = LoopSettings.from_verl_config(config)
    entry = _RESOURCES.get(id(loop))
    if entry is not None and entry[0] is loop and entry[1] == settings:
        return entry[2]
    for key in [k for k, (other, _, _) in _RESOURCES.items() if other.is_closed()]:
        del _RESOURCES[key]
    resources = _WorkerResources(settings)
    _RESOURCES[id(loop)] = (loop, settings, resources)
    return resources


async def close_loop_resources() -> None:
    """Close the env client shared by the running event loop's episodes (a worker shutting down; tests)."""
    entry = _RESOURCES.pop(id(asyncio.get_running_loop()), None)
    if entry is not None:
        await entry[2].client.aclose()


def task_id_of(row: dict[str, Any]) -> str:
    """The BFCL task id of a dataset row (`extra_info.task_id`, else `extra_info.index`)."""
    extra = row.get("extra_info") or {}
    task_id = extra.get("task_id") or extra.get("index") or row.get("index")
    if not isinstance(task_id, str) or not task_id:
        raise ValueError(f"dataset row has no extra_info.task_id: keys {sorted(row)}")
    return task_id


class _GlobalSteps:
    """Weight versions (verl global steps) the episode's generations ran on."""

    def __init__(self, fallback: int | None):
        self.fallback = fallback
        self.low: int | None = None
        self.high: int | None = None

    def add(self, extra: dict[str, Any]) -> None:
        """Record one generation's `extra_fields` (verl's client sets min/max_global_steps)."""
        low = extra.get("min_global_steps", extra.get("global_steps"))
        high = extra.get("max_global_steps", extra.get("global_steps"))
        if low is not None:
            self.low = int(low) if self.low is None else min(self.low, int(low))
        if high is not None:
            self.high = int(high) if self.high is None else max(self.high, int(high))

    def fields(self) -> dict[str, int | None]:
        low = self.low if self.low is not None else self.fallback
        high = self.high if self.high is not None else self.fallback
        return {"min_global_steps": low, "max_global_steps": high}


def verl_sampling(fields: dict[str, Any]) -> dict[str, Any]:
    """verl's sampling dict for the sampler's fields (`seal.rollout.vllm_generation.sampling_fields`), such that
    verl's vLLM server builds the same `vllm.SamplingParams` from it as the local engine and the `vllm:` policy.

    verl's server (`vLLMHttpServer.generate`) pops `max_tokens` (absent: its own budget), turns a true `logprobs`
    into vLLM's 0 and anything false into None (so the sampler's `logprobs=0` goes as True), sets
    `repetition_penalty` and `ignore_eos` when absent (verl's rollout config: 1.0 and false, vLLM's defaults), adds
    a seed when absent under its `full_determinism`, and passes the rest to `vllm.SamplingParams`. A None
    `max_tokens` or seed is left out (verl's own defaults apply, as vLLM's would)."""
    out = {k: v for k, v in fields.items() if not (k in ("max_tokens", "seed") and v is None)}
    out["logprobs"] = fields.get("logprobs") is not None
    return out


def episode_params(verl_params: dict[str, Any]) -> SamplingParams:
    """An episode's `SamplingParams` from the dict verl hands the agent loop: its temperature, top_p and top_k
    (training's, or `val_kwargs` for validation); every other field comes from the sampler (`make_generate`). No
    episode seed: verl's episodes draw from the server engine's seeded generator (docs/verl_engine.md, "One
    sampler"), as evaluation's do."""
    return SamplingParams(temperature=float(verl_params.get("temperature", 1.0)),
                          top_p=float(verl_params.get("top_p", 1.0)), top_k=int(verl_params.get("top_k", -1)))


def make_generate(server_manager: Any, stop_ids: list[int], request_id: str, steps: _GlobalSteps):
    """A `seal.rollout.types.GenerateFn` over verl's `LLMServerClient.generate` (token ids in and out).

    Each call's sampling comes from the sampler every engine shares (`sampling_fields`: the model's `stop_ids`,
    the seed rule, log-probs, the call's `max_tokens`), through `verl_sampling`; its finish reason from its tokens
    (`finish_reason`: verl's server reports "completed" for a stop and a length cap alike). One `request_id` per
    episode keeps the episode on one server (prefix-cache reuse).
    """

    async def generate(prompt_ids: list[int], params: SamplingParams) -> Generation:
        sampling = verl_sampling(sampling_fields(params, len(prompt_ids), stop_ids))
        out = await server_manager.generate(request_id=request_id, prompt_ids=list(prompt_ids),
                                            sampling_params=sampling)
        if out.stop_reason in ("aborted", "abort"):
            # Only async trainer modes abort requests; ours is synchronous, so this is a real failure.
            raise RuntimeError(f"generation aborted by the rollout server (request {request_id})")
        steps.add(dict(out.extra_fields or {}))
        ids = [int(t) for t in out.token_ids]
        logprobs = None if out.log_probs is None else [float(x) for x in out.log_probs]
        return Generation(ids, finish_reason(ids, stop_ids, params.max_tokens), logprobs)

    return generate


def rollout_to_output(rollout: Rollout, *, eos_id: int, fallback_prompt_ids: list[int],
                      global_steps: dict[str, int | None], need_logprobs: bool) -> AgentLoopOutput:
    """`AgentLoopOutput` of a finished episode (placeholder sequence for excluded / empty ones)."""
    lost = rollout.excluded  # never graded: no reward
    placeholder = lost or not rollout.response_ids
    if placeholder and not lost:  # graded but produced no token (limits): keep its reward, nothing to train on
        rollout = replace(rollout, excluded=True, exclude_reason="empty_response")
    extras = {k: v for k, v in rollout.extras().items() if k not in DROPPED_EXTRAS}
    if placeholder:
        # The short dataset prompt: an excluded episode's own prompt may be the overlong one.
        prompt_ids = list(fallback_prompt_ids) or list(rollout.prompt_ids) or [eos_id]
        # One unsampled end-of-turn token: verl needs a non-empty response; mask 0 trains nothing.
        response_ids, response_mask, logprobs = [eos_id], [0], [0.0]
        reward = 0.0 if lost else float(rollout.reward)
    else:
        prompt_ids, response_ids = list(rollout.prompt_ids), list(rollout.response_ids)
        response_mask = list(rollout.response_mask)
        logprobs = None if rollout.response_logprobs is None else list(rollout.response_logprobs)
        reward = float(rollout.reward)
    if logprobs is None and need_logprobs:
        raise RuntimeError(f"{rollout.task_id}: the rollout server returned no log-probs but "
                           "actor_rollout_ref.rollout.calculate_log_probs is on")
    accuracy = rollout.accuracy if rollout.accuracy is not None else 0.0
    extras.update(global_steps)
    extras["turn_scores"], extras["tool_rewards"] = [], []  # verl's agent-loop schema
    extras["reward_extra_info"] = {
        "acc": float(accuracy),
        "category": rollout.category or "",
        "task_id": rollout.task_id,
        "excluded": float(rollout.excluded),
    }
    if rollout.mode == "eval" and not placeholder:  # validation: its tokens, as sampled, for the run directory
        extras["reward_extra_info"][EPISODE_TOKENS_KEY] = json.dumps(
            {"prompt_ids": prompt_ids, "response_ids": response_ids, "response_mask": response_mask})
    metrics = AgentLoopMetrics(generate_sequences=rollout.model_time_s, tool_calls=rollout.env_time_s)
    return AgentLoopOutput(
        prompt_ids=prompt_ids,
        response_ids=response_ids,
        response_mask=response_mask,
        response_logprobs=logprobs if need_logprobs else None,
        reward_score=reward,
        num_turns=0 if lost else len(rollout.messages),
        metrics=metrics,
        extra_fields=extras,
    )


@register(AGENT_LOOP_NAME)
class SealBfclAgentLoop(AgentLoopBase):
    """One BFCL multi-turn episode against the env service (see the module docstring)."""

    warned_no_feed = False  # one warning per worker process

    async def run(self, sampling_params: dict[str, Any], **kwargs: Any) -> AgentLoopOutput:
        resources = _resources_for(self.config)
        settings = resources.settings
        task_id = task_id_of(kwargs)
        feed = EpisodeFeed.from_value(kwargs.get(FEED_KEY))
        if feed is None:
            # Without our trainer mode nothing says whether this is training; the raw interface in
            # eval mode is always allowed and never leaks the training interface.
            if not SealBfclAgentLoop.warned_no_feed:
                log.warning("no %s in the batch (trainer mode is not %r?): episodes run in eval mode with "
                            "the raw interface", FEED_KEY, "seal")
                SealBfclAgentLoop.warned_no_feed = True
            feed = EpisodeFeed()
        params = episode_params(sampling_params)
        fallback_step = kwargs.get("global_steps")
        steps = _GlobalSteps(int(fallback_step) if fallback_step is not None else None)
        stop_ids = resources.stop_ids(str(self.config.actor_rollout_ref.model.path), self.tokenizer)
        generate = make_generate(self.server_manager, stop_ids, uuid4().hex, steps)
        reward_fn = partial(compute_reward, cfg=settings.reward_cfg, training_progress=feed.training_progress)
        # With `rollout.check_template` every observation's tokens are checked against a full re-render of the
        # conversation with the model's own chat template (a mismatch raises and fails the run).
        tokenizer = resources.checking_codec(self.tokenizer) if settings.check_template else self.tokenizer
        async with resources.gate:
            rollout = await run_episode(
                resources.client, generate, tokenizer, task_id, feed.mode, feed.interface, params,
                settings.limits, reward_fn=reward_fn, max_restarts=settings.max_restarts,
            )
        need_logprobs = bool(self.rollout_config.get("calculate_log_probs", False))
        return rollout_to_output(rollout, eos_id=int(self.tokenizer.eos_token_id),
                                 fallback_prompt_ids=self.fallback_prompt(kwargs),
                                 global_steps=steps.fields(), need_logprobs=need_logprobs)

    def fallback_prompt(self, row: dict[str, Any]) -> list[int]:
        """Token ids of the dataset prompt, for the placeholder of an episode that never started."""
        messages = row.get("raw_prompt")
        if not messages:
            return []
        text = self.tokenizer.apply_chat_template(list(messages), tokenize=False, add_generation_prompt=True)
        return list(self.tokenizer.encode(text, add_special_tokens=False))


def validation_records(data_sources: Sequence[str], sample_uids: Sequence[str],
                       infos: Mapping[str, Sequence[Any]],
                       expected_counts: Mapping[tuple[str, str], int] | None) -> list[EpisodeRecord]:
    """One record per validation episode from `_val_metrics_update`'s arguments.

    `infos` are verl's per-sample `reward_extra_info` lists (our agent loop sets `acc`, `category`,
    `task_id`, `excluded`); `data_sources` is the category column of our parquet. Sessions verl
    expected but never got (a failed agent loop) are added as excluded failures, so every category
    keeps its full denominator.
    """
    n = len(data_sources)
    accs = list(infos.get("acc", [None] * n))
    cats = list(infos.get("category", [None] * n))
    tids = list(infos.get("task_id", [None] * n))
    excl = list(infos.get("excluded", [None] * n))
    records = []
    seen: Counter[tuple[str, str]] = Counter()
    for i in range(n):
        seen[(str(data_sources[i]), str(sample_uids[i]))] += 1
        records.append(EpisodeRecord(
            task_id=tids[i] or "",
            category=cats[i] or str(data_sources[i]),
            accuracy=accs[i],
            excluded=bool(excl[i]) if excl[i] is not None else accs[i] is None,
        ))
    for (source, uid), expected in (expected_counts or {}).items():
        for _ in range(max(int(expected) - seen[(str(source), str(uid))], 0)):
            records.append(EpisodeRecord(task_id="", category=str(source), accuracy=0.0, excluded=True))
    return records

"""The episode driver: one env-service episode per sample, for training and evaluation (docs/agent_loop.md).

`play_episode` is the one loop (create -> model call -> step -> ... -> evaluate -> delete) with the one restart
policy; how the model is called is a `Turns` object. `TokenTurns` is the token level (training, validation,
token-level evaluation: `generate` on token ids, token-exact sequences, masks, log-probs; `run_episode` /
`run_batch`), `seal.eval.policies.TextTurns` the text level (evaluation policies: messages in, text out).

Sequence layout of a token-level episode (Qwen2.5 shown; the mechanism is template-generic)::

    prompt_ids   = tok(template([system, user], generation prompt))      # "...<|im_start|>assistant\n"
    response_ids = g_1 + o_1 + g_2 + o_2 + ... + g_k
        g_i  the tokens the model sampled in call i, unchanged (ends with <|im_end|> when sampled)
        o_i  tok(increment): the template text that closes turn i and opens turn i+1, e.g.
             "\n<|im_start|>user\n{observation}<|im_end|>\n<|im_start|>assistant\n"
             (prefixed with "<|im_end|>" when call i stopped by length and did not sample it)
    response_mask = 1 on every g_i token, 0 on every o_i token

Only increments are templated and tokenised: each step renders the episode head, the last assistant
message and the new observation (a constant-size render), never the whole conversation. The text
sent to the service is `decode(g_i, skip_special_tokens=True)`; `<tool_call>` is not a special token
so tool-call markup survives.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Coroutine, Iterable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Protocol

from env_service import vocab
from env_service.protocol import CreateReply, EvaluateReply, StepReply
from seal.core.record import EpisodeRecord
from seal.rollout.client import EnvClientError, EnvProtocolError, EnvUnavailable
from seal.rollout.codec import ChatCodec, TemplateError
from seal.rollout.types import (
    GenerateFn,
    Generation,
    RewardFn,
    Rollout,
    RolloutLimits,
    SamplingParams,
    accuracy_reward,
)

log = logging.getLogger(__name__)

# Appended to an observation cut to `max_observation_tokens` (the release appended a similar marker).
OBS_TRUNCATION_MARKER = "\n... [observation truncated] ..."


@dataclass(frozen=True)
class EpisodeRequest:
    """One episode to run in `run_batch`. `params` overrides the batch's sampling params."""

    task_id: str
    mode: str = "train"
    interface: dict | None = None
    params: SamplingParams | None = None


# --- how the model is called ------------------------------------------------------------------------


class Turns(Protocol):
    """How one attempt of an episode calls its model: the seam between the driver and a policy level.

    The driver (`play_episode`) owns the protocol with the env service, the transcript `out.messages`, the
    step bound and the restart policy; an implementation owns only what its level needs: `TokenTurns`
    the token-exact sequence, masks and log-probs of training, the text level (`seal.eval.policies.TextTurns`)
    nothing but a `messages -> text` call. One instance plays one attempt (a restart builds a fresh one),
    so implementations keep per-episode state on `self`. The sync methods run without awaits: the driver
    counts their wall time as the loop's bookkeeping time (`Rollout.loop_time_s`).
    """

    def open(self, out: Rollout, head: list[dict]) -> str | None:
        """Start on the created episode's `[system, user]`; return an exclusion reason to skip the episode."""
        ...

    def reply(self, out: Rollout, messages: list[dict]) -> Awaitable[str | None]:
        """The next assistant text to step with, or None when the context is full (the episode stops and is
        graded, `stop_reason="context_limit"`). Adds its model wait to `out.model_time_s`."""
        ...

    def observe(self, out: Rollout, observation: dict) -> None:
        """Account for the observation the driver is about to append (may cut its `content` in place)."""
        ...

    def close(self, out: Rollout) -> None:
        """After the last model call, before grading."""
        ...


class TokenTurns:
    """Token level (training, validation, token-level evaluation): `generate` on token ids, token-exact.

    Keeps the sequence the model conditions on (`prompt + response so far`) and appends each sampled call and
    each observation increment to `out.response_ids` / `response_mask` / `response_logprobs` as laid out in
    the module docstring.
    """

    __slots__ = ("generate", "codec", "params", "limits", "train_unsampled_eos", "head", "head_text", "seq",
                 "logprobs", "last_text", "sampled_eos", "full_msgs")

    def __init__(self, generate: GenerateFn, codec: ChatCodec, params: SamplingParams, limits: RolloutLimits,
                 train_unsampled_eos: bool = False):
        self.generate = generate
        self.codec = codec
        self.limits = limits
        self.train_unsampled_eos = train_unsampled_eos
        # Every call asks for the per-call limit (or less, when the caller's params say so).
        self.params = replace(params, max_tokens=min(params.max_tokens or limits.max_tokens_per_call,
                                                     limits.max_tokens_per_call))
        self.head: list[dict] = []
        self.head_text = ""
        self.seq: list[int] = []
        self.logprobs: list[float] | None = []
        self.last_text = ""
        self.sampled_eos = False
        self.full_msgs: list[dict] = []  # only maintained for check_full_render

    def open(self, out: Rollout, head: list[dict]) -> str | None:
        self.head = head
        self.head_text = self.codec.render(head, True)
        out.prompt_ids = self.codec.encode(self.head_text)
        if len(out.prompt_ids) > self.limits.max_prompt_length:
            log.warning("task %s excluded: prompt has %d tokens > max_prompt_length %d", out.task_id,
                        len(out.prompt_ids), self.limits.max_prompt_length)
            return "prompt_too_long"
        self.seq = list(out.prompt_ids)
        self.full_msgs = list(head)
        return None

    async def reply(self, out: Rollout, messages: list[dict]) -> str | None:
        if self.limits.max_model_len - len(self.seq) <= self.limits.max_tokens_per_call:
            return None
        tm = time.perf_counter()
        gen: Generation = await self.generate(list(self.seq), self.params)
        tb = time.perf_counter()
        out.model_time_s += tb - tm
        ids = list(gen.token_ids)
        if gen.logprobs is not None and len(gen.logprobs) != len(ids):
            raise ValueError(f"generate returned {len(gen.logprobs)} logprobs for {len(ids)} tokens")
        codec = self.codec
        self.sampled_eos = bool(ids) and ids[-1] == codec.eos_id
        self.last_text = text = codec.decode(ids)
        self.seq += ids
        out.response_ids += ids
        out.response_mask += [1] * len(ids)
        if self.logprobs is not None and gen.logprobs is not None:
            self.logprobs += gen.logprobs
        else:
            self.logprobs = None
        out.loop_time_s += time.perf_counter() - tb
        return text

    def observe(self, out: Rollout, observation: dict) -> None:
        codec = self.codec
        inc_ids = _observation_ids(codec, self.head, self.head_text, self.last_text, self.sampled_eos, observation,
                                   self.limits)
        if codec.check_full_render:
            _check_against_full_render(codec, self.full_msgs, self.last_text, observation, self.sampled_eos, inc_ids)
        self.seq += inc_ids
        out.response_ids += inc_ids
        # The eos closing a length-stopped call was not sampled: masked 0, unless the release's behaviour (it
        # trained that artificial eos) is asked for.
        closing = int(self.train_unsampled_eos and not self.sampled_eos and inc_ids[:1] == [codec.eos_id])
        out.response_mask += [1] * closing + [0] * (len(inc_ids) - closing)
        if self.logprobs is not None:
            self.logprobs += [0.0] * len(inc_ids)

    def close(self, out: Rollout) -> None:
        out.response_logprobs = self.logprobs
        n = self.limits.max_response_length
        if len(out.response_ids) > n:
            # Release behaviour (docs/agent_loop.md, Limits): keep the head, drop the tail; the reward still grades
            # the whole episode.
            del out.response_ids[n:], out.response_mask[n:]
            if out.response_logprobs is not None:
                del out.response_logprobs[n:]
            out.truncated = True


def _observation_ids(codec: ChatCodec, head: list[dict], head_text: str, assistant: str, sampled_eos: bool,
                     obs: dict, limits: RolloutLimits) -> list[int]:
    """Token ids of the increment for `obs`, cutting the observation text when it is too long.

    Mutates `obs["content"]` when cut, so the transcript shows what the model saw.
    """
    ids = codec.encode(codec.increment_text(head, head_text, assistant, sampled_eos, obs))
    limit = limits.max_observation_tokens
    content = obs["content"]
    # Release rule: keep len_chars * (limit - 100) / n_tokens characters; repeat until it fits.
    while limit is not None and len(ids) > limit and content:
        keep = int(len(content) * (limit - 100) / len(ids))
        content = content[:keep]
        obs["content"] = content + OBS_TRUNCATION_MARKER
        ids = codec.encode(codec.increment_text(head, head_text, assistant, sampled_eos, obs))
    return ids


def _check_against_full_render(codec: ChatCodec, full_msgs: list[dict], assistant: str, obs: dict,
                               sampled_eos: bool, inc_ids: list[int]) -> None:
    before = codec.render(full_msgs, True)
    full_msgs += [{"role": "assistant", "content": assistant}, obs]
    after = codec.render(full_msgs, True)
    if not after.startswith(before):
        raise TemplateError("full-conversation render is not prefix-stable")
    expected = after[len(before):]
    expected = expected.removeprefix(assistant)
    if sampled_eos and expected.startswith(codec.eos_text):
        expected = expected[len(codec.eos_text):]
    if codec.encode(expected) != inc_ids:
        raise TemplateError(f"increment differs from the full render: {expected[:200]!r}")


# --- env-service replies ------------------------------------------------------------------------------
# Every field the driver reads from a service reply is read here. The client has already parsed each reply
# into the wire protocol's model (env_service.protocol, docs/protocol.md) and raises EnvProtocolError for one
# that breaks it; a stand-in client must return the same models. Either way the episode is excluded
# ("env_protocol").


def read_created(created: CreateReply) -> tuple[list[dict], str | None, int | None]:
    """`([system, user] as fresh messages, category, num_turns)` of a create reply."""
    if not isinstance(created, CreateReply):  # the model has checked the messages are [system, user]
        raise EnvProtocolError(f"create reply is not a CreateReply: {str(created)[:200]}")
    head = [{"role": m.role, "content": m.content} for m in created.messages]
    return head, created.info.category, created.info.num_turns


def created_episode_id(created: CreateReply) -> str:
    """The episode id of a create reply (read before anything else: the episode must be deleted)."""
    if not isinstance(created, CreateReply):
        raise EnvProtocolError(f"create reply is not a CreateReply: {str(created)[:200]}")
    return created.episode_id


def read_step(step: StepReply) -> tuple[dict | None, bool]:
    """`(observation as a fresh {role, content} message or None, done)` of a step reply."""
    # The protocol's model has checked the reply (an observation until done).
    if not isinstance(step, StepReply):
        raise EnvProtocolError(f"step reply is not a StepReply: {str(step)[:200]}")
    obs = step.observation
    return (None if obs is None else {"role": obs.role, "content": obs.content}), step.done


def grade(out: Rollout, result: EvaluateReply, reward_fn: RewardFn) -> None:
    """Copy the evaluate reply's verdict and diagnosis into `out` and compute its reward."""
    if not isinstance(result, EvaluateReply):
        raise EnvProtocolError(f"evaluate reply is not an EvaluateReply: {str(result)[:200]}")
    out.eval_result = result.model_dump()  # the reward and the run directory read the JSON form
    out.accuracy = result.accuracy
    out.progress = result.progress
    out.progress_with_irrelevance = result.progress_with_irrelevance
    out.failure_tags = list(result.failure_tags)
    out.paper_labels = list(result.paper_labels)
    out.completed = result.completed
    out.reward = float(reward_fn(out.eval_result))
    if result.official.error_type == vocab.CHECKER_EXCEPTION:
        # BFCL's checker raised: the verdict's 0 says nothing about the policy. Excluded (never trained on);
        # evaluation counts the task as errored (seal.eval.results.record_from_rollout).
        out.excluded, out.exclude_reason = True, vocab.CHECKER_ERROR
        log.warning("episode of %s excluded: BFCL's checker raised: %s", out.task_id, result.official.error_message)
    elif not result.official.consistent_with_turns:
        log.warning("episode of %s: BFCL's verdict (valid=%s) disagrees with the per-turn diagnosis %s (a harness "
                    "issue; docs/diagnosis.md)", out.task_id, result.official.valid, result.failure_tags)


async def safe_delete(client: Any, episode_id: str) -> None:
    try:
        await client.delete(episode_id)
    except (EnvClientError, EnvUnavailable) as exc:
        log.warning("could not delete episode %s: %s (the service expires it)", episode_id, exc)


# --- the driver ---------------------------------------------------------------------------------------


class _Restart(Exception):
    """The episode was lost to the env service (unreachable, or its episode vanished); start over."""


class _Exclude(Exception):
    def __init__(self, reason: str, detail: str = ""):
        self.reason = reason
        self.detail = detail
        super().__init__(f"{reason}: {detail}")


async def _env(request: Awaitable[Any]) -> Any:
    """Await one env-service request; losing the service restarts the episode."""
    try:
        return await request
    except EnvUnavailable as exc:
        raise _Restart(str(exc)) from exc


async def _play_once(client: Any, turns: Turns, task_id: str, mode: str, interface: dict | None,
                     max_model_calls: int, reward_fn: RewardFn) -> Rollout:
    out = Rollout(task_id=task_id, mode=mode, interface_version=_version(interface))
    t0 = time.perf_counter()
    try:
        created = await _env(client.create(task_id, mode, interface))
        eid = out.episode_id = created_episode_id(created)
    except EnvProtocolError as exc:  # the client has deleted the episode its reply did not describe
        raise _Exclude("env_protocol", str(exc)) from exc
    out.env_time_s += time.perf_counter() - t0
    try:
        tb = time.perf_counter()
        head, out.category, out.num_turns = read_created(created)
        out.messages = list(head)
        excluded = turns.open(out, head)
        out.loop_time_s += time.perf_counter() - tb
        if excluded is not None:
            out.excluded, out.exclude_reason, out.stop_reason = True, excluded, "excluded"
            return out

        stop_reason = "done"
        while True:
            if out.num_model_calls >= max_model_calls:
                stop_reason = "max_model_calls"
                break
            text = await turns.reply(out, out.messages)
            if text is None:
                stop_reason = "context_limit"
                break
            out.num_model_calls += 1
            out.messages.append({"role": "assistant", "content": text})
            te = time.perf_counter()
            step = await _env(client.step(eid, text))
            tb = time.perf_counter()
            out.env_time_s += tb - te
            obs, done = read_step(step)
            if done or obs is None:
                break
            turns.observe(out, obs)
            out.messages.append(obs)
            out.loop_time_s += time.perf_counter() - tb
        out.stop_reason = stop_reason
        turns.close(out)

        te = time.perf_counter()
        result = await _env(client.evaluate(eid))
        out.env_time_s += time.perf_counter() - te
        grade(out, result, reward_fn)
        return out
    except EnvClientError as exc:
        if exc.status == 404:  # the episode vanished (service restarted / expired): start over
            raise _Restart(str(exc)) from exc
        raise _Exclude(f"env_rejected:{exc.code}", str(exc)) from exc
    except EnvProtocolError as exc:
        raise _Exclude("env_protocol", str(exc)) from exc
    finally:
        await safe_delete(client, eid)


def _version(interface: dict | None) -> Any:
    return interface.get("version") if interface else None


async def play_episode(
    client: Any,
    turns: Callable[[], Turns],
    task_id: str,
    mode: str = "train",
    interface: dict | None = None,
    *,
    max_model_calls: int = 64,
    reward_fn: RewardFn = accuracy_reward,
    max_restarts: int = 2,
    restart_backoff: float = 1.0,
) -> Rollout:
    """Play one episode of `task_id` against the env service with the model `turns()` calls, and grade it.

    The one episode loop of the project (training, validation and evaluation): create -> model call -> step
    -> ... -> evaluate -> delete. `client` is an `EnvClient` (or any object with its create/step/evaluate/
    delete coroutines); `turns` builds a fresh `Turns` per attempt. The episode is always deleted on the
    service, also on errors and cancellation. The episode stops when the service says done, after
    `max_model_calls` calls (client-side safety bound), or when `turns` reports the context full; a stopped
    episode is still graded.

    Restart policy: env-service failures (`EnvUnavailable`, or a 404 for an episode that vanished) restart
    the episode from scratch up to `max_restarts` times (waiting `restart_backoff * 2**k` s); an episode
    still lost after that is returned with `excluded=True, exclude_reason="infrastructure"`. A 4xx on a step
    or evaluate returns `excluded=True, exclude_reason="env_rejected:<code>"`, a reply that breaks the wire
    protocol `"env_protocol"`. A 4xx on create (unknown task, eval with an interface) is a caller error and
    raises `EnvClientError`. Exceptions from the model call propagate (after the episode is deleted).
    """
    last_error = ""
    for attempt in range(max_restarts + 1):
        try:
            rollout = await _play_once(client, turns(), task_id, mode, interface, max_model_calls, reward_fn)
            rollout.attempts = attempt + 1
            return rollout
        except _Restart as exc:
            last_error = str(exc)
            log.warning("episode of %s lost to the env service (attempt %d/%d): %s", task_id, attempt + 1,
                        max_restarts + 1, exc)
            if attempt < max_restarts:
                await asyncio.sleep(restart_backoff * (2**attempt))
        except _Exclude as exc:
            log.warning("episode of %s excluded: %s", task_id, exc)
            return _excluded(task_id, mode, interface, exc.reason, exc.detail, attempt + 1)
    return _excluded(task_id, mode, interface, "infrastructure", last_error, max_restarts + 1)


# Exclusion reasons that mean the env service, not the policy, lost the episode (after the bounded restarts).
INFRA_REASONS = frozenset({"infrastructure", "env_protocol"})


class EnvServiceLost(RuntimeError):
    """Too many of a step's episodes were lost to the env service: the run stops (non-zero exit)."""


def check_infra_loss(records: Sequence[EpisodeRecord], max_share: float, where: Any = "the env service",
                     service_log: Path | None = None) -> None:
    """Raise ``EnvServiceLost`` when more than ``max_share`` of a step's episodes were lost to the env service.

    ``records``: the step's episode records (``Rollout.record()``). Training on the rest would look like
    a run (exit 0, every metric present) while learning from a biased few episodes, or from none.
    ``service_log``: the log of the service this run started (named only when it exists)."""
    samples = list(records)
    lost = sum(s.exclude_reason in INFRA_REASONS for s in samples)
    if samples and lost / len(samples) > max_share:
        if service_log is not None and Path(service_log).is_file():
            hint = f"Check the env service's log: {service_log}."
        else:
            hint = ("This run did not start that service (a URL named in env.urls): check the log of the process "
                    "that serves it, and whether another run stopped it.")
        raise EnvServiceLost(
            f"{lost} of {len(samples)} episodes of this step were lost to the env service at {where} after "
            f"retries and restarts (more than env.max_infra_loss = {max_share:.0%}); stopping the run. {hint}"
        )


def _excluded(task_id: str, mode: str, interface: dict | None, reason: str, detail: str, attempts: int) -> Rollout:
    return Rollout(task_id=task_id, mode=mode, excluded=True, exclude_reason=reason, stop_reason="excluded",
                   attempts=attempts, interface_version=_version(interface),
                   messages=[{"role": "error", "content": detail}])


async def run_episode(
    client: Any,
    generate: GenerateFn,
    tokenizer: Any,
    task_id: str,
    mode: str = "train",
    interface: dict | None = None,
    params: SamplingParams | None = None,
    limits: RolloutLimits | None = None,
    *,
    reward_fn: RewardFn = accuracy_reward,
    max_restarts: int = 2,
    restart_backoff: float = 1.0,
    train_unsampled_eos: bool = False,
) -> Rollout:
    """Play one episode of `task_id` at the token level (`TokenTurns`) and return it token-exact.

    `tokenizer` is a transformers tokenizer with a chat template (or a `ChatCodec`). Limits, restarts and
    exclusions as in `play_episode` with `max_model_calls=limits.max_model_calls`; additionally an initial
    prompt longer than `limits.max_prompt_length` returns `excluded=True, exclude_reason="prompt_too_long"`
    without a model call, and the context limit stops the episode (`RolloutLimits`).

    `train_unsampled_eos=True` reproduces the release's mask for a call that stopped by length: the
    `<|im_end|>` appended to close that turn is trained (mask 1) although the model never sampled
    it. Default False: only sampled tokens are trained.
    """
    codec = ChatCodec.for_tokenizer(tokenizer)
    params = params or SamplingParams()
    limits = limits or RolloutLimits()
    return await play_episode(
        client, lambda: TokenTurns(generate, codec, params, limits, train_unsampled_eos), task_id, mode, interface,
        max_model_calls=limits.max_model_calls, reward_fn=reward_fn, max_restarts=max_restarts,
        restart_backoff=restart_backoff,
    )


async def run_all(coroutines: Iterable[Coroutine[Any, Any, None]]) -> None:
    """Run coroutines concurrently; the first failure cancels the others and is raised itself, not as an
    exception group (callers catch concrete exceptions)."""
    try:
        async with asyncio.TaskGroup() as group:
            for coroutine in coroutines:
                group.create_task(coroutine)
    except BaseExceptionGroup as group_error:
        raise group_error.exceptions[0] from group_error


async def run_batch(
    client: Any,
    generate: GenerateFn,
    tokenizer: Any,
    requests: Sequence[EpisodeRequest],
    params: SamplingParams | None = None,
    limits: RolloutLimits | None = None,
    *,
    concurrency: int = 256,
    reward_fn: RewardFn = accuracy_reward,
    max_restarts: int = 2,
    restart_backoff: float = 1.0,
    train_unsampled_eos: bool = False,
    on_done: Callable[[int, Rollout], None] | None = None,
) -> list[Rollout]:
    """Run `requests` concurrently (at most `concurrency` episodes at once); results keep their order.

    If an episode raises (a `generate` failure, a create refused with 4xx), the other episodes are
    cancelled (and deleted on the service) and the exception propagates.
    `on_done(index, rollout)` is called as each episode finishes (progress reporting).
    """
    if concurrency <= 0:
        raise ValueError("concurrency must be positive")
    codec = ChatCodec.for_tokenizer(tokenizer)
    gate = asyncio.Semaphore(concurrency)
    results: list[Rollout | None] = [None] * len(requests)

    async def one(i: int, req: EpisodeRequest) -> None:
        async with gate:
            results[i] = await run_episode(
                client, generate, codec, req.task_id, req.mode, req.interface, req.params or params, limits,
                reward_fn=reward_fn, max_restarts=max_restarts, restart_backoff=restart_backoff,
                train_unsampled_eos=train_unsampled_eos,
            )
        if on_done is not None:
            on_done(i, results[i])  # type: ignore[arg-type]

    await run_all(one(i, req) for i, req in enumerate(requests))
    return [r for r in results if r is not None]

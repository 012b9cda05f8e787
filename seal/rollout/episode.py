"""Token-exact agent loop: drives one env-service episode per sample (see docs/agent_loop.md).

Sequence layout for one episode (Qwen2.5 shown; the mechanism is template-generic)::

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
import weakref
from collections.abc import Callable, Coroutine, Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Any, ClassVar

from seal.rollout.client import EnvClientError, EnvUnavailable
from seal.rollout.codec import fast_encoder_for
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


class TemplateError(RuntimeError):
    """The chat template does not extend a conversation by appending text (token bookkeeping impossible)."""


class EnvProtocolError(RuntimeError):
    """The env service answered with a payload that does not follow the wire protocol."""


class ChatCodec:
    """Tokenizer + chat template operations the agent loop needs, with per-tokenizer constants cached.

    `check_full_render=True` (tests/debugging) additionally renders the whole conversation at every
    step and checks that the increment equals the difference of full renders; it costs O(conversation)
    per step and is off in training.
    """

    def __init__(self, tokenizer: Any, check_full_render: bool = False, fast_encode: bool = True):
        self.tokenizer = tokenizer
        self.check_full_render = check_full_render
        eos_id = tokenizer.eos_token_id
        eos_text = tokenizer.eos_token
        if not isinstance(eos_id, int) or not eos_text:
            raise ValueError("tokenizer needs a single eos token (the chat template's end-of-turn token)")
        if getattr(tokenizer, "chat_template", None) is None:
            raise ValueError("tokenizer has no chat template")
        self.eos_id: int = eos_id
        self.eos_text: str = eos_text
        # The fast path: call the Rust tokenizer directly (the transformers wrapper adds ~50-100 us per
        # call). Equivalent for encode without special tokens; decode goes through the wrapper only when
        # it would clean up spaces.
        self._backend = getattr(tokenizer, "backend_tokenizer", None)
        # Qwen2.5 vocabularies get a tiktoken encoder with identical ids (seal.rollout.codec.FastQwenEncoder):
        # HF's BPE needs ~12 ms for a long BFCL system prompt, tiktoken under 1 ms.
        self._fast = fast_encoder_for(tokenizer) if fast_encode else None
        self._wrapper_decode = bool(getattr(tokenizer, "clean_up_tokenization_spaces", False))
        sentinel = "\u2063probe\u2063"
        probe = self.render([{"role": "user", "content": "u"}, {"role": "assistant", "content": sentinel}], False)
        if eos_text not in probe.split(sentinel, 1)[-1]:
            raise ValueError(f"the chat template does not close assistant turns with the eos token {eos_text!r}")

    _cache: ClassVar[weakref.WeakKeyDictionary] = weakref.WeakKeyDictionary()

    @classmethod
    def for_tokenizer(cls, tokenizer: Any) -> ChatCodec:
        """The codec of `tokenizer`, built once per tokenizer object."""
        if isinstance(tokenizer, ChatCodec):
            return tokenizer
        try:
            codec = cls._cache.get(tokenizer)
        except TypeError:  # not weak-referenceable / not hashable
            return cls(tokenizer)
        if codec is None:
            codec = cls(tokenizer)
            cls._cache[tokenizer] = codec
        return codec

    def render(self, messages: list[dict], add_generation_prompt: bool) -> str:
        return self.tokenizer.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=add_generation_prompt
        )

    def encode(self, text: str) -> list[int]:
        if self._fast is not None:
            ids = self._fast(text)
            if ids is not None:
                return ids
        if self._backend is not None:
            return self._backend.encode(text, add_special_tokens=False).ids
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def decode(self, ids: list[int]) -> str:
        """Text of sampled tokens as sent to the env: special tokens (the eos) dropped."""
        if self._backend is not None and not self._wrapper_decode:
            return self._backend.decode(ids, skip_special_tokens=True)
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    def increment_text(self, head: list[dict], head_text: str, assistant: str, sampled_eos: bool,
                       observation: dict) -> str:
        """Template text between the end of the sampled tokens and the next generation point.

        Rendered as template(head + [assistant, observation], generation prompt) minus
        template(head, generation prompt) (= `head_text`), minus the assistant content and, when the
        model sampled it, the eos. `head` is the episode's [system, user]; assuming (and checked by
        `check_full_render`) that a turn's rendering does not depend on earlier turns, this render has
        constant size whatever the conversation length.
        """
        full = self.render(head + [{"role": "assistant", "content": assistant}, observation], True)
        if not full.startswith(head_text):
            raise TemplateError("chat template is not prefix-stable: the head renders differently once "
                                "an assistant turn follows")
        rest = full[len(head_text):]
        if rest.startswith(assistant):
            rest = rest[len(assistant):]
        else:
            # The template rewrites assistant content in history (e.g. drops reasoning); the sampled
            # tokens stay what they were, and the increment starts at the turn's end token.
            cut = rest.find(self.eos_text)
            if cut < 0:
                raise TemplateError("cannot find the end of the assistant turn in the rendered template")
            rest = rest[cut:]
        if sampled_eos:
            if not rest.startswith(self.eos_text):
                raise TemplateError(f"assistant turn does not end with {self.eos_text!r} in the template")
            rest = rest[len(self.eos_text):]
        return rest


@dataclass(frozen=True)
class EpisodeRequest:
    """One episode to run in `run_batch`. `params` overrides the batch's sampling params."""

    task_id: str
    mode: str = "train"
    interface: dict | None = None
    params: SamplingParams | None = None


class _Restart(Exception):
    """The episode was lost to the env service (unreachable, or its episode vanished); start over."""


class _Exclude(Exception):
    def __init__(self, reason: str, detail: str = ""):
        self.reason = reason
        self.detail = detail
        super().__init__(f"{reason}: {detail}")


def check_step(step: Any) -> tuple[dict | None, bool]:
    if not isinstance(step, dict) or not isinstance(step.get("done"), bool):
        raise EnvProtocolError(f"step reply lacks a boolean 'done': {str(step)[:200]}")
    obs = step.get("observation")
    if obs is not None and not (isinstance(obs, dict) and isinstance(obs.get("content"), str)
                                and isinstance(obs.get("role"), str)):
        raise EnvProtocolError(f"step observation is not {{role, content}}: {str(obs)[:200]}")
    if obs is None and not step["done"]:
        raise EnvProtocolError("step reply has no observation but the episode is not done")
    return obs, step["done"]


def check_created(created: Any) -> list[dict]:
    msgs = created.get("messages") if isinstance(created, dict) else None
    if (not isinstance(msgs, list) or len(msgs) != 2
            or [m.get("role") if isinstance(m, dict) else None for m in msgs] != ["system", "user"]
            or not all(isinstance(m.get("content"), str) for m in msgs)):
        raise EnvProtocolError(f"create reply must carry messages [system, user]: {str(created)[:200]}")
    return [{"role": m["role"], "content": m["content"]} for m in msgs]


async def safe_delete(client: Any, episode_id: str) -> None:
    try:
        await client.delete(episode_id)
    except (EnvClientError, EnvUnavailable) as exc:
        log.warning("could not delete episode %s: %s (the service expires it)", episode_id, exc)


async def _run_once(client: Any, generate: GenerateFn, codec: ChatCodec, task_id: str, mode: str,
                    interface: dict | None, params: SamplingParams, limits: RolloutLimits,
                    reward_fn: RewardFn, train_unsampled_eos: bool) -> Rollout:
    out = Rollout(task_id=task_id, mode=mode,
                  interface_version=interface.get("version") if interface else None)
    t0 = time.perf_counter()
    try:
        created = await client.create(task_id, mode, interface)
    except EnvUnavailable as exc:
        raise _Restart(str(exc)) from exc
    out.env_time_s += time.perf_counter() - t0
    eid = created["episode_id"]
    out.episode_id = eid
    try:
        tb = time.perf_counter()
        head = check_created(created)
        info = created.get("info") or {}
        out.category = info.get("category")
        out.num_turns = info.get("num_turns")
        head_text = codec.render(head, True)
        out.prompt_ids = codec.encode(head_text)
        out.messages = list(head)
        out.loop_time_s += time.perf_counter() - tb
        if len(out.prompt_ids) > limits.max_prompt_length:
            out.excluded, out.exclude_reason, out.stop_reason = True, "prompt_too_long", "excluded"
            log.warning("task %s excluded: prompt has %d tokens > max_prompt_length %d", task_id,
                        len(out.prompt_ids), limits.max_prompt_length)
            return out

        # All response bookkeeping below runs without awaits, so its wall time is the loop's CPU time.
        seq = list(out.prompt_ids)  # prompt + response so far: what the model conditions on
        response, mask = out.response_ids, out.response_mask
        logprobs: list[float] | None = []
        full_msgs = list(head)  # only maintained for check_full_render
        stop_reason = "done"
        while True:
            if out.num_model_calls >= limits.max_model_calls:
                stop_reason = "max_model_calls"
                break
            room = limits.max_model_len - len(seq)
            if room <= limits.max_tokens_per_call:
                stop_reason = "context_limit"
                break
            call_params = replace(params, max_tokens=min(params.max_tokens or limits.max_tokens_per_call,
                                                         limits.max_tokens_per_call))
            tm = time.perf_counter()
            gen: Generation = await generate(list(seq), call_params)
            tb = time.perf_counter()
            out.model_time_s += tb - tm
            out.num_model_calls += 1
            ids = list(gen.token_ids)
            if gen.logprobs is not None and len(gen.logprobs) != len(ids):
                raise ValueError(f"generate returned {len(gen.logprobs)} logprobs for {len(ids)} tokens")
            sampled_eos = bool(ids) and ids[-1] == codec.eos_id
            text = codec.decode(ids)
            seq += ids
            response += ids
            mask += [1] * len(ids)
            if logprobs is not None and gen.logprobs is not None:
                logprobs += gen.logprobs
            else:
                logprobs = None
            assistant = {"role": "assistant", "content": text}
            out.messages.append(assistant)
            out.loop_time_s += time.perf_counter() - tb

            te = time.perf_counter()
            try:
                step = await client.step(eid, text)
            except EnvUnavailable as exc:
                raise _Restart(str(exc)) from exc
            tb = time.perf_counter()
            out.env_time_s += tb - te
            obs, done = check_step(step)
            if done or obs is None:
                break
            obs_msg = {"role": obs["role"], "content": obs["content"]}
            inc_ids = _observation_ids(codec, head, head_text, text, sampled_eos, obs_msg, limits)
            if codec.check_full_render:
                _check_against_full_render(codec, full_msgs, text, obs_msg, sampled_eos, inc_ids)
            seq += inc_ids
            response += inc_ids
            # The eos closing a length-stopped call was not sampled: masked 0, unless the release's
            # behaviour (it trained that artificial eos) is asked for.
            closing = int(train_unsampled_eos and not sampled_eos and inc_ids[:1] == [codec.eos_id])
            mask += [1] * closing + [0] * (len(inc_ids) - closing)
            if logprobs is not None:
                logprobs += [0.0] * len(inc_ids)
            out.messages.append(obs_msg)
            out.loop_time_s += time.perf_counter() - tb
        out.stop_reason = stop_reason
        out.response_logprobs = logprobs

        if len(response) > limits.max_response_length:
            # Release behaviour (docs/release_behaviour.md §8.3): keep the head, drop the tail; the reward still
            # grades the episode.
            n = limits.max_response_length
            del response[n:], mask[n:]
            if out.response_logprobs is not None:
                del out.response_logprobs[n:]
            out.truncated = True

        te = time.perf_counter()
        try:
            result = await client.evaluate(eid)
        except EnvUnavailable as exc:
            raise _Restart(str(exc)) from exc
        out.env_time_s += time.perf_counter() - te
        if not isinstance(result, dict) or "accuracy" not in result:
            raise EnvProtocolError(f"evaluate reply lacks 'accuracy': {str(result)[:200]}")
        out.eval_result = result
        out.accuracy = float(result["accuracy"])
        out.progress = result.get("progress")
        out.progress_with_irrelevance = result.get("progress_with_irrelevance")
        out.failure_tags = list(result.get("failure_tags") or [])
        out.paper_labels = list(result.get("paper_labels") or [])
        out.completed = result.get("completed")
        out.reward = float(reward_fn(result))
        return out
    except EnvClientError as exc:
        if exc.status == 404:  # the episode vanished (service restarted / expired): start over
            raise _Restart(str(exc)) from exc
        raise _Exclude(f"env_rejected:{exc.code}", str(exc)) from exc
    except EnvProtocolError as exc:
        raise _Exclude("env_protocol", str(exc)) from exc
    finally:
        await safe_delete(client, eid)


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
    """Play one episode of `task_id` against the env service and return it token-exact.

    `client` is an `EnvClient` (or any object with its create/step/evaluate/delete coroutines);
    `tokenizer` a transformers tokenizer with a chat template (or a `ChatCodec`). The episode is
    always deleted on the service, also on errors and cancellation.

    Env-service failures (`EnvUnavailable`, or a 404 for an episode that vanished) restart the episode
    from scratch up to `max_restarts` times (waiting `restart_backoff * 2**k` s); an episode still
    lost after that is returned with `excluded=True, exclude_reason="infrastructure"`. A 4xx on a step
    or evaluate returns `excluded=True, exclude_reason="env_rejected:<code>"`. A 4xx on create (unknown
    task, eval with an interface) is a caller error and raises `EnvClientError`. Exceptions from
    `generate` propagate (after the episode is deleted).

    `train_unsampled_eos=True` reproduces the release's mask for a call that stopped by length: the
    `<|im_end|>` appended to close that turn is trained (mask 1) although the model never sampled
    it. Default False: only sampled tokens are trained.
    """
    codec = ChatCodec.for_tokenizer(tokenizer)
    params = params or SamplingParams()
    limits = limits or RolloutLimits()
    last_error = ""
    for attempt in range(max_restarts + 1):
        try:
            rollout = await _run_once(client, generate, codec, task_id, mode, interface, params, limits, reward_fn,
                                      train_unsampled_eos)
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
            return Rollout(task_id=task_id, mode=mode, excluded=True, exclude_reason=exc.reason,
                           stop_reason="excluded", attempts=attempt + 1,
                           interface_version=interface.get("version") if interface else None,
                           messages=[{"role": "error", "content": exc.detail}])
    return Rollout(task_id=task_id, mode=mode, excluded=True, exclude_reason="infrastructure",
                   stop_reason="excluded", attempts=max_restarts + 1,
                   interface_version=interface.get("version") if interface else None,
                   messages=[{"role": "error", "content": last_error}])


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

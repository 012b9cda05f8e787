"""Token-level generation with vLLM: the engine settings that evaluation and the local engine share, whether vLLM
can run a model here, and `ColocatedVLLM`, the local engine's `rollout.backend: vllm`.

`ColocatedVLLM` is a `GenerateFn` over a vLLM engine that runs inside the training process, next to the Hugging
Face policy it samples for:

- In-process: vLLM's engine core, scheduler and model runner run in this process (`VLLM_ENABLE_V1_MULTIPROCESSING=0`
  while the engine is built; on vLLM's CPU build that also selects the one-process executor instead of a worker
  process). Why not a separate engine process: the weights then go into vLLM by reference after every update
  (`sync_weights`, no copy through shared memory or sockets), no process or /dev/shm segment can be left behind,
  and on a small CPU machine no idle engine process polls for work while the actor trains.
- Calls from concurrent episodes are queued; one worker thread adds them to vLLM's scheduler and steps the engine
  while any is unfinished (continuous batching: a call that arrives mid-batch joins at the next step). Each call
  returns its tokens exactly as sampled, with the log-probability vLLM computed for each (`logprobs=0`, in
  `processed_logprobs` mode: after temperature, as the actor recomputes them).
- `sync_weights` loads the actor's weights with vLLM's own in-place reload (`Worker.reload_weights`: the layerwise
  reload, which on vLLM's CPU build restores the parameters its oneDNN repacking replaced and repacks once at the
  end) and drops the prefix cache, whose keys and values the old weights computed.

What building an engine in-process changes in the caller's process is undone after it is built (`_in_process`):
vLLM seeds Python's, NumPy's and torch's global RNGs (the trainer's resume restores those), replaces
`torch.set_num_threads` by a no-op, freezes the garbage collector's heap and caches its environment variables.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import gc
import itertools
import json
import logging
import os
import random
import threading
from collections.abc import Iterable, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from seal.rollout.calls import call_seed, settle, stop_token_ids
from seal.rollout.types import Generation, SamplingParams

log = logging.getLogger(__name__)


# --------------------------------------------------------------------------- engine settings
def vllm_on_cpu() -> bool:
    """True when the installed vLLM is its CPU build (it decides from its version's `+cpu` suffix)."""
    from vllm.platforms import current_platform

    return bool(current_platform.is_cpu())


def _model_config(path: str | os.PathLike) -> dict[str, Any]:
    """The text model's `config.json` (its `text_config` for multimodal configs)."""
    config = json.loads((Path(path) / "config.json").read_text(encoding="utf-8"))
    return config.get("text_config", config) if "num_hidden_layers" not in config else config


def head_dim(config: dict[str, Any]) -> int:
    return int(config.get("head_dim") or config["hidden_size"] // int(config["num_attention_heads"]))


def kv_bytes_per_token(path: str | os.PathLike, dtype: str | None = None) -> int:
    """KV-cache bytes one token takes in a model of this `config.json`: keys and values of every layer, in `dtype`
    (default: the model's own; float32: 4 bytes, else 2)."""
    config = _model_config(path)
    kv_heads = int(config.get("num_key_value_heads") or config["num_attention_heads"])
    dtype = dtype or str(config.get("dtype") or config.get("torch_dtype") or "bfloat16")
    return 2 * int(config["num_hidden_layers"]) * kv_heads * head_dim(config) * (4 if "32" in dtype else 2)


CPU_KV_SHARE = 0.25  # at most this share of the host's available memory goes to vLLM's KV cache on CPU (ours)
# vLLM's KV-cache manager keeps one block of the cache for itself (its null block): a cache of exactly one
# full-length sequence refused to start (measured: SmolLM2, max_model_len 8192, max_num_seqs 1: "the estimated
# maximum model length is 8064", one 128-token CPU block short). The floor adds that block.
CPU_KV_RESERVED_TOKENS = 128


def cpu_kv_cache_bytes(path: str | os.PathLike, max_model_len: int, max_num_seqs: int,
                       available: int | None = None, dtype: str | None = None) -> int:
    """vLLM's KV cache on CPU: room for `max_num_seqs` full-length sequences, capped at `CPU_KV_SHARE` of the
    host's available memory but never below one full-length sequence (and vLLM's reserved block).

    On CPU vLLM reads `gpu_memory_utilization` as a share of the whole host RAM and refuses to start when
    that much is not free (on a shared machine, always); an explicit size avoids it, and sizes the cache
    from what the run needs rather than from the machine."""
    if available is None:
        import psutil

        available = int(psutil.virtual_memory().available)
    per_token = kv_bytes_per_token(path, dtype)
    per_sequence = per_token * max_model_len
    floor = per_token * (max_model_len + CPU_KV_RESERVED_TOKENS)
    return max(floor, min(per_sequence * max_num_seqs, int(available * CPU_KV_SHARE)))


def cpu_has_fast_bf16() -> bool:
    """Whether this CPU computes bfloat16 natively (AVX-512 BF16 or AMX). vLLM's CPU build loads a model in
    bfloat16 by default; without these instructions its oneDNN kernels refuse bfloat16 and the fallback is
    many times slower than float32 (measured: a 3.4k-token prefill of SmolLM2-135M took minutes on an
    AVX2-only machine)."""
    import torch

    return bool(torch.cpu._is_avx512_bf16_supported() or getattr(torch.cpu, "_is_amx_tile_supported", bool)())


def vllm_engine_kwargs(path: str, tensor_parallel_size: int, gpu_memory_utilization: float, max_model_len: int,
                       max_num_seqs: int, dtype: str | None = None) -> dict[str, Any]:
    """vLLM engine arguments: prefix caching on (an episode's calls share their conversation prefix, so each call
    prefills only the new turn); on vLLM's CPU build also eager mode (graph capture and compilation cost minutes
    and buy nothing for a few hundred calls) and an explicit KV-cache size (`cpu_kv_cache_bytes`). `dtype` None:
    vLLM's default, except float32 on a CPU without fast bfloat16."""
    kwargs: dict[str, Any] = {"model": path, "tensor_parallel_size": tensor_parallel_size,
                              "max_model_len": max_model_len, "max_num_seqs": max_num_seqs,
                              "enable_prefix_caching": True}
    if dtype is not None:
        kwargs["dtype"] = dtype
    if vllm_on_cpu():
        if dtype is None and not cpu_has_fast_bf16():
            kwargs["dtype"] = "float32"
        kwargs.update(enforce_eager=True,
                      kv_cache_memory_bytes=cpu_kv_cache_bytes(path, max_model_len, max_num_seqs,
                                                               dtype=kwargs.get("dtype")))
    else:
        kwargs["gpu_memory_utilization"] = gpu_memory_utilization
    return kwargs


def vllm_cannot_run(path: str | os.PathLike, device_type: str) -> str | None:
    """Why vLLM cannot generate with the model at `path` on this kind of device (`cpu` or `cuda`); None when it can.

    Checked: vLLM imports; its build matches the device (the CPU build on `cpu`, a GPU build on `cuda`); on the
    CPU build, the model's head size is one that vLLM's CPU attention has kernels for (32 and up: the default
    tiny model's 16 is not)."""
    try:
        import vllm  # noqa: F401
    except ImportError:
        return "vLLM is not installed"
    on_cpu = vllm_on_cpu()
    if on_cpu != (device_type == "cpu"):
        return f"the installed vLLM is its {'CPU' if on_cpu else 'GPU'} build and the device is {device_type}"
    if not (Path(path) / "config.json").is_file():
        return f"no model directory at {path} (vLLM gets the same files as the actor)"
    if on_cpu:
        from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend

        size, sizes = head_dim(_model_config(path)), CPUAttentionBackend.get_supported_head_sizes()
        if size not in sizes:
            return f"head_dim {size} is not among the head sizes of vLLM's CPU attention ({sizes})"
    return None


# --------------------------------------------------------------------------- one sampler
def model_stop_token_ids(path: str | os.PathLike, tokenizer: Any) -> list[int]:
    """`calls.stop_token_ids` of the model at `path` without loading its weights: the tokenizer's eos plus the
    generation config's eos ids, read as the Hugging Face model reads them (its `generation_config.json`, else
    the one derived from `config.json`). Evaluation's `vllm:` policy stops where training stops."""
    from transformers import AutoConfig, GenerationConfig

    try:
        generation = GenerationConfig.from_pretrained(path)
    except OSError:  # no generation_config.json: the model derives one from its config
        generation = GenerationConfig.from_model_config(AutoConfig.from_pretrained(path))
    return stop_token_ids(SimpleNamespace(generation_config=generation), tokenizer)


def sampling_fields(params: SamplingParams, prompt_len: int, stop_ids: Iterable[int]) -> dict[str, Any]:
    """The `vllm.SamplingParams` fields of one model call, for every engine: the local engine (`ColocatedVLLM`),
    evaluation's `vllm:` policy (both through `vllm_sampling`) and the verl engine's agent loop (through its
    adapter to verl's sampling dict, `seal.engines.verl.agent_loop.verl_sampling`). They are:
    the model's stop tokens (kept in the call's tokens, as sampled); the per-call seed of every backend
    (`calls.call_seed`: the episode's seed and the prompt length, so each call of an episode draws anew; none
    without an episode seed); the log-probability of each sampled token (`logprobs=0`: the sampled token's only);
    the call's `max_tokens`; no detokenising (token ids are the output). vLLM-free (the verl adapter's tests)."""
    seed = call_seed(params.seed, prompt_len) if params.seed is not None else None
    return {"temperature": params.temperature, "top_p": params.top_p, "top_k": params.top_k,
            "max_tokens": params.max_tokens, "seed": seed, "logprobs": 0,
            "stop_token_ids": sorted({int(s) for s in stop_ids}), "detokenize": False}


def vllm_sampling(params: SamplingParams, prompt_len: int, stop_ids: Iterable[int]) -> Any:
    """The `vllm.SamplingParams` of one model call (`sampling_fields`), for training (`ColocatedVLLM`) and
    evaluation (the `vllm:` policy) alike."""
    import vllm

    return vllm.SamplingParams(**sampling_fields(params, prompt_len, stop_ids))


def finish_reason(token_ids: list[int], stop_ids: Iterable[int], max_tokens: int | None) -> str:
    """The finish reason vLLM gives a call that ended normally, from its tokens (vLLM's scheduler, `check_stop`:
    a stop token ends the call with "stop" before the length cap is looked at): "stop" when the last token is one
    of `stop_ids` (the builder's, which include the tokenizer's eos), "length" when the call reached
    `max_tokens`. Anything else (e.g. the model's context filled up first) is an error, never read as a stop.
    For servers that report no finish reason of their own (verl's: "completed" for both)."""
    stops = {int(s) for s in stop_ids}
    if token_ids and int(token_ids[-1]) in stops:
        return "stop"
    if max_tokens is not None and len(token_ids) >= max_tokens:
        return "length"
    raise RuntimeError(f"a call ended after {len(token_ids)} tokens without a stop token and below max_tokens "
                       f"{max_tokens} (the model's context full?)")


def vllm_generation(completion: Any) -> Generation:
    """A `Generation` from vLLM's completion of one call: its tokens as sampled, with their log-probabilities; a
    finish reason other than stop or length (an abort) is an error, never read as a stop."""
    ids = list(completion.token_ids)
    if completion.finish_reason not in ("stop", "length"):
        raise RuntimeError(f"vLLM ended a call with finish_reason {completion.finish_reason!r}")
    logprobs = ([float(completion.logprobs[i][t].logprob) for i, t in enumerate(ids)]
                if completion.logprobs is not None else None)
    return Generation(ids, completion.finish_reason, logprobs)


# --------------------------------------------------------------------------- the colocated engine
@contextlib.contextmanager
def _in_process() -> Iterator[None]:
    """Build a vLLM engine inside this process and leave the process as it was (module docstring)."""
    import numpy as np
    import torch

    saved_env = os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING")
    rng = (random.getstate(), np.random.get_state(), torch.get_rng_state(),
           torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None)
    threads, set_threads = torch.get_num_threads(), torch.set_num_threads
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    try:
        yield
    finally:
        if saved_env is None:
            os.environ.pop("VLLM_ENABLE_V1_MULTIPROCESSING", None)
        else:
            os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = saved_env
        from vllm import envs

        envs.disable_envs_cache()  # vLLM engines built later in this process read the environment again
        torch.set_num_threads = set_threads
        torch.set_num_threads(threads)
        gc.unfreeze()
        random.setstate(rng[0])
        np.random.set_state(rng[1])
        torch.set_rng_state(rng[2])
        if rng[3] is not None:
            torch.cuda.set_rng_state_all(rng[3])


class ColocatedVLLM:
    """`GenerateFn` over an in-process vLLM engine, with `sync_weights` and `close` (module docstring).

    `stop_ids`: the tokens that end a call (the HF generator's: the tokenizer's eos and the model's generation eos
    ids); kept in the call's tokens, as sampled. `engine_kwargs`: `vllm.EngineArgs` fields (`vllm_engine_kwargs`);
    `logprobs_mode`, `seed` and `disable_log_stats` are set here.
    """

    def __init__(self, engine_kwargs: dict[str, Any], stop_ids: Iterable[int], seed: int = 0):
        from vllm import EngineArgs
        from vllm.v1.engine.llm_engine import LLMEngine

        # No periodic throughput lines in the training log (the run logs its own timings).
        self.engine_kwargs = dict(engine_kwargs, logprobs_mode="processed_logprobs", seed=int(seed),
                                  disable_log_stats=True)
        self.stop_ids = sorted({int(s) for s in stop_ids})
        with _in_process():
            self.engine = LLMEngine.from_engine_args(EngineArgs(**self.engine_kwargs))
        self.lock = threading.Lock()  # the engine: one step, request admission or weight load at a time
        self._cv = threading.Condition()
        self._pending: list[tuple[list[int], SamplingParams, concurrent.futures.Future]] = []
        self._live: dict[str, concurrent.futures.Future] = {}
        self._ids = itertools.count()
        self._closing = False
        self._worker: threading.Thread | None = None
        self.steps = 0  # engine steps taken (benchmarks)

    def describe(self) -> str:
        kw = self.engine_kwargs
        where = (f"KV cache {kw['kv_cache_memory_bytes'] / 2**30:.2f} GiB of host RAM"
                 if "kv_cache_memory_bytes" in kw else f"GPU memory share {kw.get('gpu_memory_utilization')}")
        return (f"in-process vLLM, {kw.get('dtype', 'model dtype')}, {'eager, ' if kw.get('enforce_eager') else ''}"
                f"{where}, up to {kw['max_num_seqs']} sequences, prefix caching")

    # ---- the GenerateFn
    async def __call__(self, prompt_ids: list[int], params: SamplingParams) -> Generation:
        if not params.max_tokens:  # fail in the caller, not in the worker
            raise ValueError("SamplingParams.max_tokens must be set (the agent loop sets it)")
        future: concurrent.futures.Future = concurrent.futures.Future()
        with self._cv:
            if self._closing:
                raise RuntimeError("ColocatedVLLM: the engine is closed")
            if self._worker is None or not self._worker.is_alive():
                self._worker = threading.Thread(target=self._serve, name="vllm-generation", daemon=True)
                self._worker.start()
            self._pending.append((list(prompt_ids), params, future))
            self._cv.notify()
        return await asyncio.wrap_future(future)

    def _sampling(self, prompt_ids: list[int], params: SamplingParams) -> Any:
        return vllm_sampling(params, len(prompt_ids), self.stop_ids)

    @staticmethod
    def _generation(output: Any) -> Generation:
        return vllm_generation(output.outputs[0])

    # ---- the worker
    def _serve(self) -> None:
        while True:
            with self._cv:
                while not self._pending and not self._live and not self._closing:
                    self._cv.wait()
                if self._closing:
                    return
                new, self._pending = self._pending, []
            done: list[tuple[concurrent.futures.Future, Any, BaseException | None]] = []
            with self.lock:
                for prompt_ids, params, future in new:
                    request_id = str(next(self._ids))
                    try:
                        self.engine.add_request(request_id, {"prompt_token_ids": prompt_ids},
                                                self._sampling(prompt_ids, params))
                    except Exception as exc:  # noqa: BLE001 - that call fails, the others go on
                        done.append((future, None, exc))
                        continue
                    self._live[request_id] = future
                if self._live:
                    try:
                        outputs = self.engine.step()
                        self.steps += 1
                    except BaseException as exc:  # noqa: BLE001 - every waiting episode gets the error
                        self.engine.abort_request(list(self._live))
                        done += [(f, None, exc) for f in self._live.values()]
                        self._live.clear()
                        outputs = []
                    for output in outputs:
                        if output.finished and output.request_id in self._live:
                            future = self._live.pop(output.request_id)
                            try:
                                done.append((future, self._generation(output), None))
                            except Exception as exc:  # noqa: BLE001
                                done.append((future, None, exc))
            for future, result, exc in done:
                settle(future, result, exc)

    # ---- weights and shutdown
    def sync_weights(self, model: Any) -> None:
        """Load the Hugging Face `model`'s parameters into the engine (by reference, in its checkpoint names), then
        drop the prefix cache. Between rollouts only (no call may be in flight).

        Every name a parameter has is sent, tied ones too (`remove_duplicate=False`): a tied LM head shares the
        embedding's tensor in vLLM as well, but on the CPU build it multiplies with a kernel packed from it when its
        own layer is processed, and the layerwise reload processes only the layers that received weights. Without
        `lm_head.weight` the head kept the old weights (measured: log-probs off by ~4 nats after one update)."""
        weights = ((name, p.detach()) for name, p in model.named_parameters(remove_duplicate=False))
        with self.lock:
            if self._live:
                raise RuntimeError("ColocatedVLLM.sync_weights: calls are in flight")
            self.engine.collective_rpc("reload_weights", kwargs={"weights_iterator": weights,
                                                                 "is_checkpoint_format": True})
            if not self.engine.reset_prefix_cache():
                raise RuntimeError("vLLM did not reset its prefix cache after the weight update")

    def close(self) -> None:
        """Stop the worker and shut the engine down (its model, KV cache and torch.distributed group go)."""
        with self._cv:
            if self._closing:
                return
            self._closing = True
            self._cv.notify_all()
        if self._worker is not None:
            self._worker.join()
        for future in self._live.values():
            settle(future, exc=RuntimeError("ColocatedVLLM closed"))
        for _, _, future in self._pending:
            settle(future, exc=RuntimeError("ColocatedVLLM closed"))
        with self.lock:
            self.engine.engine_core.shutdown()
            del self.engine
        gc.collect()


def colocated_vllm(path: str | os.PathLike, model: Any, tokenizer: Any, device_type: str, max_model_len: int,
                   max_num_seqs: int, seed: int = 0, dtype: str = "bfloat16",
                   gpu_memory_utilization: float = 0.6) -> ColocatedVLLM:
    """The local engine's vLLM engine beside the HF `model` loaded from `path` (and the benchmark's, built the same
    way): the HF generator's stop tokens; float32 on CPU, where the actor computes in float32 (the log-prob check
    compares the two), else `dtype`; up to `max_num_seqs` sequences (the episodes in flight)."""
    on_cpu = device_type == "cpu"
    kwargs = vllm_engine_kwargs(str(path), 1, gpu_memory_utilization, max_model_len, max_num_seqs,
                                dtype="float32" if on_cpu else dtype)
    if on_cpu:
        # Every call is seeded. vLLM's model runner rewinds a seeded request's generator after each partial
        # (chunked) prefill step, which CPU generators cannot do ("CPU Generator does not use offset"): on CPU every
        # prompt is prefilled whole, with a token budget of at least one full-length sequence per step.
        kwargs.update(enable_chunked_prefill=False, max_num_batched_tokens=max(max_model_len, max_num_seqs))
    return ColocatedVLLM(kwargs, stop_token_ids(model, tokenizer), seed=seed)

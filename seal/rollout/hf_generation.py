"""Token-level generation with a local Hugging Face causal LM (the ``GenerateFn`` of the local engine and of
``seal.evaluate --policy hf:<path>``): token ids exactly as sampled, one log-probability per token.

Two layers:

- `generate_batch(model, prompts, params, ...)`: the token-in/token-out function. Rows are left-padded
  into one batch (attention mask and position ids say where each row starts), prefilled together and
  decoded together with one KV cache; each row samples with its own `torch.Generator` seeded from its
  own call (`call_seed`), stops on its own stop token or length, and leaves the batch when it does.
- `HFGenerator`: the async `GenerateFn`. Model calls of concurrent episodes are queued and served
  together by one worker thread (at most `max_batch_size` rows and `max_batch_tokens` padded prompt
  tokens per batch); with `max_batch_size=1` calls run one at a time (the deterministic mode).

Memory. The batch's KV cache is allocated once, at the batch's final length, and written in place
(`_BatchLayer`): transformers' `DynamicLayer` concatenates at every decode step, a new and slightly larger
tensor per layer and step, and the attention's per-step buffers (the KV heads repeated to every attention head,
the mask) grew with it, so CUDA's caching allocator kept reserving new blocks it could not reuse. Attention reads
views of the cache rounded up to `KV_BUCKET` positions, so every per-step buffer keeps one size for
`KV_BUCKET` steps and is reused. On a GPU, `MemoryBudget` (rollout.hf_gpu_memory_fraction) caps the process's
allocator at a share of the card and takes into a batch only the calls whose cache and buffers fit.

Why not transformers' continuous batching: in the installed version (5.x) the manager has one sampling
configuration and one seed for all requests, so per-call seeds (what makes a resumed run repeat the
uninterrupted one) and per-call temperature do not fit; it also needs its own paged cache.

Determinism. A row's sampled tokens depend only on its prompt, its seed and its logits. The logits of a
row computed in a batch can differ from those computed alone in the last floating-point bits (other
matrix shapes, padding); which calls share a batch depends on timing. So the batched mode is
reproducible per call only up to those bits (greedy and sampled outputs agree with one-at-a-time
generation unless two tokens are within rounding of a tie or of a sampling boundary), and one changed
token changes the rest of its episode. One at a time (`max_batch_size=1`) computes every call alone,
so results are bit-for-bit independent of concurrency and a resumed run repeats the uninterrupted one.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from transformers.cache_utils import Cache, DynamicCache, DynamicLayer

from seal.rollout.calls import call_seed, settle, stop_token_ids
from seal.rollout.types import Generation, SamplingParams

log = logging.getLogger(__name__)

# Attention reads the cache in views of a multiple of this many positions (the tail masked), so that the per-step
# buffers sized by the view keep one size for this many decode steps and the allocator reuses them.
KV_BUCKET = 256


def autocast_context(device: torch.device, dtype: torch.dtype | None):
    """The forward passes' autocast: `dtype` on a GPU, none on CPU (or when `dtype` is None).

    Both the generator here (`generate_batch`) and the local engine's actor (`seal/engines/local/actor.py`,
    log-probs and the update) run under it, and must, so that the actor's log-probs are those of the sampled
    tokens' own precision. It lives here, not in the actor's module, because this module is the lower of the two
    layers (seal.rollout < seal.engines, docs/layout.md): the generator cannot import the actor."""
    if dtype is None or device.type != "cuda":
        return torch.autocast(device_type="cpu", enabled=False)
    return torch.autocast(device_type="cuda", dtype=dtype)


# --------------------------------------------------------------------------- one batch, token in / token out
def _row_generator(params: SamplingParams, prompt_len: int) -> torch.Generator | None:
    """The row's own RNG (CPU, so the stream is the same on every device); None when greedy."""
    if params.temperature <= 0.0:
        return None
    seed = call_seed(params.seed, prompt_len) if params.seed is not None else int(torch.randint(2**62, (1,)))
    return torch.Generator().manual_seed(seed)


def _filter(probs: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """One row's probabilities `[V]` with top-k / top-p applied (zeros outside; not renormalised)."""
    if 0 < params.top_k < probs.numel():
        kth = torch.topk(probs, params.top_k).values[-1]
        probs = torch.where(probs >= kth, probs, torch.zeros_like(probs))
    if params.top_p < 1.0:
        sorted_p, order = torch.sort(probs, descending=True)
        keep = (sorted_p.cumsum(0) - sorted_p) < float(params.top_p) * sorted_p.sum()  # always keeps the top token
        probs = torch.zeros_like(probs).scatter(0, order[keep], sorted_p[keep])
    return probs


def _sample(logits: torch.Tensor, params: Sequence[SamplingParams], gens: Sequence[torch.Generator | None]
            ) -> tuple[list[int], list[float]]:
    """One token per row from float32 logits `[n, V]`; returns (tokens, log-probs).

    Greedy rows take the argmax of the raw logits. A sampled row draws one uniform number from its own
    generator and inverts the cumulative distribution of softmax(logits / temperature) after top-k/top-p
    (one draw per token, so the row's stream does not depend on the other rows). The log-prob is under
    softmax(logits / temperature) before top-k/top-p (temperature 1 when greedy), the distribution
    verl's recomputed log-probs use. Few passes over the vocabulary: with a 151,936-token vocabulary
    and a small model they cost as much as the model itself.
    """
    tokens = [0] * len(params)
    logps = [0.0] * len(params)
    greedy = [i for i, g in enumerate(gens) if g is None]
    rows = [i for i, g in enumerate(gens) if g is not None]
    if greedy:
        sub = logits[greedy]
        top = sub.argmax(dim=-1)
        chosen = sub.gather(-1, top.unsqueeze(-1)).squeeze(-1) - torch.logsumexp(sub, dim=-1)
        for j, i in enumerate(greedy):
            tokens[i], logps[i] = int(top[j]), float(chosen[j])
    if rows:
        sub = logits[rows]
        temps = torch.tensor([float(params[i].temperature) for i in rows], dtype=sub.dtype, device=sub.device)
        if bool((temps != 1.0).any()):
            sub = sub / temps.unsqueeze(-1)
        top = sub.max(dim=-1, keepdim=True).values
        probs = (sub - top).exp()  # unnormalised
        lse = top.squeeze(-1) + probs.sum(dim=-1).log()
        for j, i in enumerate(rows):
            if 0 < params[i].top_k < probs.shape[-1] or params[i].top_p < 1.0:
                probs[j] = _filter(probs[j], params[i])
        cdf = probs.cumsum(dim=-1)
        draws = torch.tensor([float(torch.rand((), generator=gens[i])) for i in rows], dtype=cdf.dtype,
                             device=cdf.device)
        picked = torch.searchsorted(cdf, (draws * cdf[:, -1]).unsqueeze(-1), right=True)
        picked = picked.clamp(max=cdf.shape[-1] - 1)
        chosen = sub.gather(-1, picked).squeeze(-1) - lse
        for j, i in enumerate(rows):
            tokens[i], logps[i] = int(picked[j, 0]), float(chosen[j])
    return tokens, logps


def _round_up(n: int) -> int:
    return -(-n // KV_BUCKET) * KV_BUCKET


class _BatchLayer(DynamicLayer):
    """One decoder layer's keys and values for a whole batch: `[rows, kv_heads, capacity, head_dim]` tensors
    allocated once, written in place; attention gets views of the first `_round_up(filled)` positions (the
    unfilled tail is masked by the attention mask, `generate_batch` marks a position valid once it is written)."""

    def __init__(self, keys: torch.Tensor, values: torch.Tensor, filled: int):
        super().__init__()
        self.dtype, self.device = keys.dtype, keys.device
        self.is_initialized = True
        self.buffers = (keys, values)
        self._view(filled)

    def _view(self, filled: int) -> None:
        self.filled = filled
        end = _round_up(filled)
        self.keys, self.values = self.buffers[0][:, :, :end], self.buffers[1][:, :, :end]

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
               ) -> tuple[torch.Tensor, torch.Tensor]:
        keys, values = self.buffers
        end = self.filled + key_states.shape[-2]
        if end > keys.shape[2]:
            raise RuntimeError(f"batch KV cache holds {keys.shape[2]} positions, {end} needed")
        keys[:, :, self.filled:end] = key_states
        values[:, :, self.filled:end] = value_states
        self._view(end)
        return self.keys, self.values

    def get_seq_length(self) -> int:
        return self.filled

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return _round_up(self.filled + query_length), 0

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        self.buffers = (self.buffers[0][indices], self.buffers[1][indices])  # smaller: the allocator reuses blocks
        self._view(self.filled)


def _prefill(model: Any, prompts: Sequence[Sequence[int]], device: torch.device, capacity: int,
             cache_dtype: torch.dtype | None) -> tuple[Cache, torch.Tensor]:
    """The batch's KV cache ([rows, heads, capacity, head_dim] a layer, prompts right-aligned at the longest
    prompt's length) and each row's next-token logits [rows, vocab], float32.

    Prefill row by row: a long prompt fills the device alone, and with no padding each prompt's KV cache and
    first logits are exactly those of a call alone; each row's cache is then copied, left-padded, into the
    batch's."""
    bsz, width = len(prompts), max(len(p) for p in prompts)
    buffers: list[tuple[torch.Tensor, torch.Tensor]] = []
    first = []
    for i, p in enumerate(prompts):
        row = DynamicCache(config=model.config)
        ids = torch.as_tensor([list(p)], dtype=torch.long, device=device)
        out = model(input_ids=ids, past_key_values=row, use_cache=True, logits_to_keep=1)
        first.append(out.logits[:, -1, :].float())
        if not buffers:
            kinds = {type(layer).__name__ for layer in row.layers if type(layer) is not DynamicLayer}
            if kinds:
                raise ValueError(f"batched HF generation keeps every position of every layer; this model's "
                                 f"cache has {sorted(kinds)} layers")
            buffers = [(layer.keys.new_zeros((bsz, layer.keys.shape[1], capacity, layer.keys.shape[3]),
                                             dtype=cache_dtype or layer.keys.dtype),
                        layer.values.new_zeros((bsz, layer.values.shape[1], capacity, layer.values.shape[3]),
                                               dtype=cache_dtype or layer.values.dtype))
                       for layer in row.layers]
        for (keys, values), layer in zip(buffers, row.layers, strict=True):
            keys[i, :, width - len(p):width] = layer.keys[0]
            values[i, :, width - len(p):width] = layer.values[0]
        del row, out
    return Cache(layers=[_BatchLayer(keys, values, width) for keys, values in buffers]), torch.cat(first)


def generate_batch(model: Any, prompts: Sequence[Sequence[int]], params: Sequence[SamplingParams],
                   stop_ids: Sequence[int], device: torch.device, autocast_dtype: torch.dtype | None = None
                   ) -> list[Generation]:
    """Generate for every prompt together; returns one `Generation` (tokens as sampled, log-probs) per row.

    Each row has its own `SamplingParams` (temperature 0 = greedy; `max_tokens` required; `seed` gives the
    row its own generator, seeded with `call_seed(seed, len(prompt))`). The stop token is kept in
    `token_ids` (finish_reason "stop"); a row that reaches `max_tokens` ends with "length".
    """
    if len(prompts) != len(params) or not prompts:
        raise ValueError(f"generate_batch: {len(prompts)} prompts and {len(params)} SamplingParams")
    for p in params:
        if not p.max_tokens:
            raise ValueError("SamplingParams.max_tokens must be set (the agent loop sets it)")
    if any(not p for p in prompts):
        raise ValueError("generate_batch: empty prompt")
    stops = set(int(s) for s in stop_ids)
    bsz, width = len(prompts), max(len(p) for p in prompts)
    # every position the batch can write: the prompts, then one per generated token but the last (never fed back)
    capacity = _round_up(width + max(int(p.max_tokens) for p in params) - 1)
    # Under autocast every reader of the cache (sdpa, or matmul in eager attention) casts keys and values to the
    # autocast dtype, so the cache holds them in it: the same attention, at half the memory of the float32 keys
    # (rotary output) and values (promoted to the keys' dtype by DynamicLayer) a float32 model leaves there.
    cache_dtype = autocast_dtype if device.type == "cuda" else None
    gens = [_row_generator(p, len(q)) for p, q in zip(params, prompts, strict=True)]
    tokens: list[list[int]] = [[] for _ in range(bsz)]
    logps: list[list[float]] = [[] for _ in range(bsz)]
    finish: list[str] = ["length"] * bsz
    live = list(range(bsz))  # batch row -> request index
    with torch.no_grad(), autocast_context(device, autocast_dtype):
        cache, logits = _prefill(model, prompts, device, capacity, cache_dtype)
        # 1 where a position holds a token: the prompts right-aligned at `width`, then each position once written
        attn = torch.zeros((bsz, capacity), dtype=torch.long, device=device)
        for i, p in enumerate(prompts):
            attn[i, width - len(p):width] = 1
        filled = width
        next_pos = torch.as_tensor([[len(p)] for p in prompts], dtype=torch.long, device=device)
        while True:
            step_tokens, step_logps = _sample(logits, [params[r] for r in live], [gens[r] for r in live])
            keep = []
            for row_i, req in enumerate(live):
                token, lp = step_tokens[row_i], step_logps[row_i]
                tokens[req].append(token)
                logps[req].append(lp)
                if token in stops:
                    finish[req] = "stop"
                elif len(tokens[req]) < int(params[req].max_tokens):
                    keep.append(row_i)
            if not keep:
                break
            step = torch.as_tensor(step_tokens, dtype=torch.long, device=device).unsqueeze(-1)
            if len(keep) < len(live):  # finished rows leave the batch (and the KV cache)
                sel = torch.as_tensor(keep, dtype=torch.long, device=device)
                cache.batch_select_indices(sel)
                step, attn, next_pos = step[sel], attn[sel], next_pos[sel]
                live = [live[r] for r in keep]
            attn[:, filled] = 1
            filled += 1
            out = model(input_ids=step, attention_mask=attn[:, :_round_up(filled)], position_ids=next_pos,
                        past_key_values=cache, use_cache=True)
            logits = out.logits[:, -1, :].float()
            del out
            next_pos = next_pos + 1
    return [Generation(tokens[i], finish[i], logps[i]) for i in range(bsz)]  # type: ignore[arg-type]


# --------------------------------------------------------------------------- the GPU memory budget
@dataclass(frozen=True)
class CudaMemory:
    """One reading of the CUDA memory query, the one GPU-only input of `MemoryBudget` (tests pass a stand-in)."""
    free: int       # bytes free on the device, every process counted (torch.cuda.mem_get_info)
    total: int      # the device's memory
    allocated: int  # this process's live tensors (torch.cuda.memory_allocated)
    reserved: int   # this process's caching allocator, allocated included (torch.cuda.memory_reserved)


def cuda_memory(device: torch.device) -> CudaMemory:
    free, total = torch.cuda.mem_get_info(device)
    return CudaMemory(free, total, torch.cuda.memory_allocated(device), torch.cuda.memory_reserved(device))


class MemoryBudget:
    """How many calls a generation batch may take within a share (`fraction`) of the GPU's memory.

    A batch of n rows padded to `width` prompt tokens, generating up to `max_new` tokens each, holds
    - its KV cache, allocated once: n x capacity positions x `kv_bytes` (keys and values of every layer), where
      capacity is `width + max_new - 1` rounded up to `KV_BUCKET`;
    - per decode step, freed after: one layer's keys and values repeated to every attention head (transformers'
      sdpa path does so when a padding mask is passed), n x capacity x `attention_bytes`, and the float32 logits
      with the sampler's buffers over the vocabulary, n x `vocab_bytes`;
    - the prefill of one prompt alone: its own cache and one layer's activations, width x `prefill_bytes`.
    Element sizes are the cache's: the autocast dtype's under autocast (`generate_batch`), else the weights'. The
    prefill and attention terms are upper estimates. What a batch may use is
    `min(fraction x total - allocated, free + reserved - allocated)`: the share left beside what this process
    holds (weights, optimizer), and never more than the device has free (other processes) plus this process's
    allocator cache.
    """

    def __init__(self, model: Any, fraction: float, device: torch.device, autocast_dtype: torch.dtype | None = None,
                 query: Callable[[torch.device], CudaMemory] = cuda_memory):
        if not 0 < fraction <= 1:
            raise ValueError(f"MemoryBudget: fraction {fraction} is not in (0, 1]")
        cfg = model.config.get_text_config()
        heads = int(cfg.num_attention_heads)
        kv_heads = int(getattr(cfg, "num_key_value_heads", None) or heads)
        head_dim = int(getattr(cfg, "head_dim", None) or cfg.hidden_size // heads)
        hidden = int(cfg.hidden_size)
        intermediate = int(getattr(cfg, "intermediate_size", None) or 4 * hidden)
        elem = autocast_dtype.itemsize if autocast_dtype is not None else next(model.parameters()).element_size()
        self.kv_bytes = 2 * int(cfg.num_hidden_layers) * kv_heads * head_dim * elem
        self.attention_bytes = 2 * heads * head_dim * elem
        self.vocab_bytes = 4 * int(cfg.vocab_size) * 4
        self.prefill_bytes = self.kv_bytes + (4 * intermediate + 8 * hidden) * elem
        self.fraction, self.device, self.query = float(fraction), device, query

    def batch_bytes(self, rows: int, width: int, max_new: int) -> int:
        capacity = _round_up(width + max_new - 1)
        return (rows * capacity * (self.kv_bytes + self.attention_bytes) + rows * self.vocab_bytes
                + width * self.prefill_bytes)

    def available(self) -> int:
        m = self.query(self.device)
        return min(int(self.fraction * m.total) - m.allocated, m.free + m.reserved - m.allocated)


def gpu_memory_budget(model: Any, device: torch.device, fraction: float,
                      autocast_dtype: torch.dtype | None = None) -> MemoryBudget | None:
    """On CUDA: caps this process's caching allocator at `fraction` of the card (so nothing the process does
    takes the whole card: when the cap is reached the allocator frees its cache and retries before it fails)
    and returns the budget generation batches are sized by. None on CPU (batches bounded by rows and tokens)."""
    if device.type != "cuda":
        return None
    torch.cuda.set_per_process_memory_fraction(fraction, device)
    return MemoryBudget(model, fraction, device, autocast_dtype)


# --------------------------------------------------------------------------- the async GenerateFn
@dataclass
class _Call:
    prompt_ids: list[int]
    params: SamplingParams
    future: concurrent.futures.Future
    arrived: float


class HFGenerator:
    """`GenerateFn` over a Hugging Face causal LM: concurrent calls are generated together.

    Calls are queued; one worker thread (the event loop keeps serving the other episodes' HTTP traffic)
    takes what is waiting, up to `max_batch_size` calls and `max_batch_tokens` padded prompt tokens,
    after letting arrivals settle (it starts once no call has arrived for `batch_wait_s`, or the batch is
    full, or the oldest call has waited `8 * batch_wait_s`), and runs `generate_batch`. Calls that arrive
    during a batch wait for the next one. `max_batch_size=1`: one call at a time, in a worker thread.
    With a `memory_budget` a batch also takes only the calls that fit what the budget leaves available when the
    batch is formed; a first call that alone does not fit runs alone (the allocator's cap is the hard bound).
    """

    def __init__(self, model: Any, tokenizer: Any, device: torch.device, autocast_dtype: torch.dtype | None = None,
                 max_batch_size: int = 1, max_batch_tokens: int = 262_144, batch_wait_s: float = 0.02,
                 memory_budget: MemoryBudget | None = None):
        if max_batch_size < 1 or max_batch_tokens < 1 or batch_wait_s < 0:
            raise ValueError(f"HFGenerator: max_batch_size={max_batch_size}, max_batch_tokens={max_batch_tokens}, "
                             f"batch_wait_s={batch_wait_s}: need >= 1, >= 1, >= 0")
        self.model = model
        self.tokenizer = tokenizer
        self.device = device
        self.autocast_dtype = autocast_dtype
        self.stop_ids = stop_token_ids(model, tokenizer)
        pad = tokenizer.pad_token_id
        self.pad_id = int(pad if pad is not None else tokenizer.eos_token_id)
        self.max_batch_size = int(max_batch_size)
        self.max_batch_tokens = int(max_batch_tokens)
        self.batch_wait_s = float(batch_wait_s)
        self.memory_budget = memory_budget
        self.lock = threading.Lock()  # one model: one batch at a time
        self._queue: list[_Call] = []
        self._cv = threading.Condition()
        self._worker: threading.Thread | None = None
        self.batch_sizes: list[int] = []  # rows of every batch served (for benchmarks and metrics)

    async def __call__(self, prompt_ids: list[int], params: SamplingParams) -> Generation:
        if self.max_batch_size == 1:
            return await asyncio.to_thread(self.generate_sync, prompt_ids, params)
        if not params.max_tokens:  # fail in the caller, not in the batch it would share
            raise ValueError("SamplingParams.max_tokens must be set (the agent loop sets it)")
        call = _Call(list(prompt_ids), params, concurrent.futures.Future(), time.monotonic())
        with self._cv:
            if self._worker is None or not self._worker.is_alive():
                self._worker = threading.Thread(target=self._serve, name="hf-generation", daemon=True)
                self._worker.start()
            self._queue.append(call)
            self._cv.notify()
        return await asyncio.wrap_future(call.future)

    def generate_sync(self, prompt_ids: list[int], params: SamplingParams) -> Generation:
        """One call alone (blocking)."""
        with self.lock:
            self.batch_sizes.append(1)
            return generate_batch(self.model, [prompt_ids], [params], self.stop_ids, self.device,
                                  self.autocast_dtype)[0]

    # ---- the worker
    def _take(self) -> list[_Call]:
        """Wait for calls, let arrivals settle, and take the next batch (oldest first). Holds `_cv`."""
        while not self._queue:
            self._cv.wait()
        while len(self._queue) < self.max_batch_size:
            now = time.monotonic()
            quiet = now - self._queue[-1].arrived
            if quiet >= self.batch_wait_s or now - self._queue[0].arrived >= 8 * self.batch_wait_s:
                break
            self._cv.wait(timeout=self.batch_wait_s - quiet)
        budget = self.memory_budget
        try:
            available = budget.available() if budget is not None else 0
        except Exception as exc:  # noqa: BLE001 - the waiting calls get the error instead of waiting forever
            for call in self._queue:
                settle(call.future, exc=exc)
            self._queue.clear()
            return []
        batch: list[_Call] = []
        for call in self._queue:
            width = max([len(c.prompt_ids) for c in batch] + [len(call.prompt_ids)])
            if batch and (len(batch) >= self.max_batch_size or width * (len(batch) + 1) > self.max_batch_tokens):
                break
            if budget is not None:
                max_new = max(int(c.params.max_tokens) for c in [*batch, call])
                need = budget.batch_bytes(len(batch) + 1, width, max_new)
                if need > available:
                    if batch:
                        break
                    log.warning("HF generation: one call of %d prompt tokens needs ~%.2f GB, the memory budget leaves "
                                "%.2f GB; it runs alone", len(call.prompt_ids), need / 1e9, available / 1e9)
            batch.append(call)
        del self._queue[:len(batch)]
        return batch

    def _serve(self) -> None:
        while True:
            with self._cv:
                batch = self._take()
            if not batch:
                continue
            try:
                with self.lock:
                    self.batch_sizes.append(len(batch))
                    outs = generate_batch(self.model, [c.prompt_ids for c in batch], [c.params for c in batch],
                                          self.stop_ids, self.device, self.autocast_dtype)
            except BaseException as exc:  # noqa: BLE001 - every waiting episode gets the error, the worker lives on
                for c in batch:
                    settle(c.future, exc=exc)
                continue
            for c, out in zip(batch, outs, strict=True):
                settle(c.future, result=out)

    @classmethod
    def from_pretrained(cls, path: str, device: str | None = None, dtype: str = "auto",
                        max_batch_size: int = 1) -> HFGenerator:
        """Load a model directory; ``device`` None = CUDA when available; ``dtype`` a torch dtype name or auto."""
        from transformers import AutoModelForCausalLM, AutoTokenizer

        device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        torch_dtype = getattr(torch, dtype) if dtype != "auto" else "auto"
        tokenizer = AutoTokenizer.from_pretrained(path)
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch_dtype).to(device).eval()
        return cls(model, tokenizer, torch.device(device), max_batch_size=max_batch_size)

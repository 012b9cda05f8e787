"""Batched Hugging Face generation (seal.rollout.hf_generation) on the tiny random Qwen2, against
transformers' own `generate` and the model's own forward pass."""

from __future__ import annotations

import asyncio
import random

import pytest
import torch

from seal.rollout import hf_generation as H
from seal.rollout.hf_generation import CudaMemory, HFGenerator, MemoryBudget, generate_batch
from seal.rollout.types import SamplingParams

CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from seal.models.tiny import build_tiny_qwen2

    path = build_tiny_qwen2(tmp_path_factory.mktemp("tiny") / "model")
    return AutoModelForCausalLM.from_pretrained(path).eval(), AutoTokenizer.from_pretrained(path)


def _prompts(n: int, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(1000, 100_000) for _ in range(rng.randrange(20, 300))] for _ in range(n)]


def _agrees_with_transformers(model, gen, prompt: list[int], out, max_tokens: int) -> None:
    """`out` is transformers' own greedy `generate` of `prompt`, and its log-probs are the model's teacher-forced
    log-probabilities of those tokens."""
    from transformers import GenerationConfig

    ref = model.generate(torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                         generation_config=GenerationConfig(max_new_tokens=max_tokens, do_sample=False,
                                                            eos_token_id=gen.stop_ids, pad_token_id=gen.pad_id))
    assert out.token_ids == ref[0, len(prompt):].tolist()
    full = torch.tensor([prompt + out.token_ids])
    with torch.no_grad():
        logp = torch.log_softmax(model(full).logits[0, len(prompt) - 1:-1].float(), -1)
    expected = logp.gather(-1, torch.tensor(out.token_ids).unsqueeze(-1)).squeeze(-1)
    assert torch.allclose(torch.tensor(out.logprobs), expected, atol=1e-4)


def test_greedy_batch_equals_one_at_a_time_and_transformers_generate(tiny):

    model, tok = tiny
    gen = HFGenerator(model, tok, CPU)
    prompts = _prompts(5)
    greedy = SamplingParams(temperature=0.0, max_tokens=10)
    batched = generate_batch(model, prompts, [greedy] * 5, gen.stop_ids, CPU)
    for k, (prompt, out) in enumerate(zip(prompts, batched, strict=True)):
        alone = generate_batch(model, [prompt], [greedy], gen.stop_ids, CPU)[0]
        assert out.token_ids == alone.token_ids and out.finish_reason == alone.finish_reason
        if k >= 2:
            continue  # transformers' generate and the log-prob check on the first two
        _agrees_with_transformers(model, gen, prompt, out, max_tokens=10)


def test_rows_stop_on_their_own_and_leave_the_batch(tiny):
    model, tok = tiny
    gen = HFGenerator(model, tok, CPU)
    prompts = _prompts(4, seed=1)
    greedy = SamplingParams(temperature=0.0, max_tokens=8)
    free = generate_batch(model, prompts, [greedy] * 4, gen.stop_ids, CPU)
    row1 = free[1].token_ids
    k = max(i for i in range(len(row1)) if row1[i] not in row1[:i])  # the last token new to row 1 ...
    stop = row1[k]  # ... becomes a stop token: row 1 stops there
    limits = [SamplingParams(temperature=0.0, max_tokens=m) for m in (8, 8, 3, 5)]
    outs = generate_batch(model, prompts, limits, gen.stop_ids + [stop], CPU)
    assert outs[1].token_ids == row1[:k + 1] and outs[1].finish_reason == "stop"
    if stop not in free[2].token_ids[:3]:
        assert outs[2].token_ids == free[2].token_ids[:3] and outs[2].finish_reason == "length"
    assert len(outs[3].logprobs) == len(outs[3].token_ids) == 5
    for i in (0, 3):  # rows that continue after others left produce what they produce alone
        cut = next((k + 1 for k, t in enumerate(free[i].token_ids) if t == stop), 8)
        cut = min(cut, limits[i].max_tokens)
        assert outs[i].token_ids == free[i].token_ids[:cut]


def test_sampling_is_seeded_per_row(tiny):
    model, tok = tiny
    gen = HFGenerator(model, tok, CPU)
    prompts = _prompts(4, seed=2)
    params = [SamplingParams(temperature=1.0, max_tokens=12, seed=s) for s in (7, 7, 8, 9)]
    a = generate_batch(model, prompts, params, gen.stop_ids, CPU)
    b = generate_batch(model, prompts[::-1], params[::-1], gen.stop_ids, CPU)[::-1]
    assert [x.token_ids for x in a] == [x.token_ids for x in b]  # order in the batch does not matter
    same_prompt = generate_batch(model, [prompts[0]] * 3, [params[0], params[0], params[2]], gen.stop_ids, CPU)
    assert same_prompt[0].token_ids == same_prompt[1].token_ids != same_prompt[2].token_ids
    alone = generate_batch(model, [prompts[3]], [params[3]], gen.stop_ids, CPU)[0]
    assert alone.token_ids[0] == a[3].token_ids[0]  # the prefill is per row: the first draw is exact
    topk = generate_batch(model, prompts[:1], [SamplingParams(temperature=1.0, top_k=1, max_tokens=6, seed=3)],
                          gen.stop_ids, CPU)[0]
    greedy = generate_batch(model, prompts[:1], [SamplingParams(temperature=0.0, max_tokens=6)], gen.stop_ids, CPU)
    assert topk.token_ids == greedy[0].token_ids  # top-k 1 is greedy
    with pytest.raises(ValueError, match="max_tokens"):
        generate_batch(model, prompts[:1], [SamplingParams()], gen.stop_ids, CPU)


def test_generator_serves_concurrent_calls_together(tiny):
    model, tok = tiny
    prompts = _prompts(6, seed=3)
    greedy = SamplingParams(temperature=0.0, max_tokens=6)
    batched, serial = HFGenerator(model, tok, CPU, max_batch_size=8), HFGenerator(model, tok, CPU)

    async def all_calls(gen):
        return await asyncio.gather(*(gen(p, greedy) for p in prompts))

    outs = asyncio.run(all_calls(batched))
    assert max(batched.batch_sizes) > 1 and sum(batched.batch_sizes) == 6
    alone = asyncio.run(all_calls(serial))
    assert serial.batch_sizes == [1] * 6
    assert [(o.token_ids, o.finish_reason) for o in outs] == [(o.token_ids, o.finish_reason) for o in alone]
    # the batch's logits differ from a call alone in the last bits
    assert all(torch.allclose(torch.tensor(a.logprobs), torch.tensor(b.logprobs), atol=1e-4)
               for a, b in zip(outs, alone, strict=True))

    async def bad_call():
        return await batched(prompts[0], SamplingParams(temperature=0.0))

    with pytest.raises(ValueError, match="max_tokens"):
        asyncio.run(bad_call())
    assert [o.token_ids for o in asyncio.run(all_calls(batched))] == [o.token_ids for o in outs]  # still serving


def test_the_batch_cache_is_written_in_place_across_buckets(tiny, monkeypatch):
    """The KV cache is allocated once per batch and written in place (transformers' DynamicLayer concatenates a
    new tensor per layer and step); attention sees views rounded up to KV_BUCKET positions with the unwritten tail
    masked. A bucket of 4 makes the views cross many boundaries: the output is still transformers' own greedy
    `generate` and the model's teacher-forced log-probs."""

    model, tok = tiny
    monkeypatch.setattr(H, "KV_BUCKET", 4)
    gen = HFGenerator(model, tok, CPU)
    prompts = _prompts(3, seed=5)
    seen = []  # after each decode call: (layer 0's key buffer address, rows, view length, filled, mask length)

    def record(_module, _args, kwargs, _output):
        cache = kwargs.get("past_key_values")
        if isinstance(cache, H.Cache) and isinstance(cache.layers[0], H._BatchLayer):
            layer = cache.layers[0]
            seen.append((layer.buffers[0].data_ptr(), layer.buffers[0].shape[0], layer.keys.shape[2], layer.filled,
                         kwargs["attention_mask"].shape[1]))

    handle = model.register_forward_hook(record, with_kwargs=True)
    try:
        limits = [SamplingParams(temperature=0.0, max_tokens=m) for m in (14, 3, 14)]
        outs = generate_batch(model, prompts, limits, gen.stop_ids, CPU)
    finally:
        handle.remove()
    width = max(len(p) for p in prompts)
    assert [f for *_, f, _ in seen] == list(range(width + 1, width + 1 + len(seen)))  # one position per step
    for _ptr, _rows, view, filled, mask in seen:
        assert view % 4 == 0 and filled <= view < filled + 4 and mask == view  # the bucketed view, masked tail
    assert len({view for _p, _r, view, _f, _m in seen}) > 2  # several buckets crossed
    by_rows = {}
    for ptr, rows, *_ in seen:
        by_rows.setdefault(rows, set()).add(ptr)
    assert all(len(ptrs) == 1 for ptrs in by_rows.values())  # one buffer while the rows stay: no reallocation
    assert sorted(by_rows) == [2, 3] and outs[1].finish_reason == "length"  # row 1 left after 3 tokens
    for prompt, out, lim in zip(prompts, outs, limits, strict=True):
        _agrees_with_transformers(model, gen, prompt, out, max_tokens=lim.max_tokens)


def test_a_cache_in_the_autocast_dtype_gives_the_same_attention(tiny):
    """Under autocast every reader of the cache casts keys and values to the autocast dtype, so on a GPU
    `generate_batch` keeps the cache in it (half the memory of the float32 keys and values transformers leaves
    there). No GPU here: CPU autocast, whose table puts sdpa and matmul in the same lower-precision class as the
    CUDA table does, stands in. A decode step reading a float32 cache and one reading its bf16 copy give the same
    logits, bit for bit."""
    model, _ = tiny
    prompt = _prompts(1, seed=7)[0]
    n = len(prompt)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        row = H.DynamicCache(config=model.config)
        model(input_ids=torch.tensor([prompt]), past_key_values=row, use_cache=True)
        assert row.layers[0].keys.dtype == row.layers[0].values.dtype == torch.float32
        capacity = H._round_up(n + 1)
        mask = torch.zeros((1, capacity), dtype=torch.long)
        mask[0, :n + 1] = 1
        logits = {}
        for dtype in (torch.float32, torch.bfloat16):
            layers = []
            for layer in row.layers:
                keys = torch.zeros((1, layer.keys.shape[1], capacity, layer.keys.shape[3]), dtype=dtype)
                values = torch.zeros((1, layer.values.shape[1], capacity, layer.values.shape[3]), dtype=dtype)
                keys[:, :, :n], values[:, :, :n] = layer.keys, layer.values
                layers.append(H._BatchLayer(keys, values, n))
            out = model(input_ids=torch.tensor([[prompt[-1]]]), attention_mask=mask, position_ids=torch.tensor([[n]]),
                        past_key_values=H.Cache(layers=layers), use_cache=True)
            logits[dtype] = out.logits.float()
    assert torch.equal(logits[torch.float32], logits[torch.bfloat16])


GB = 10**9


def _reading(free, total, allocated, reserved):
    """A stand-in for the CUDA memory query (torch.cuda.mem_get_info and the allocator's counters): the one part
    of the budget that needs a GPU. Everything else below is the real code on CPU."""
    return lambda _device: CudaMemory(free=free, total=total, allocated=allocated, reserved=reserved)


def test_memory_budget_arithmetic(tiny):
    model, _ = tiny
    cfg = model.config
    head_dim = cfg.hidden_size // cfg.num_attention_heads
    budget = MemoryBudget(model, 0.5, CPU, query=_reading(free=60 * GB, total=100 * GB, allocated=10 * GB,
                                                            reserved=12 * GB))
    assert budget.kv_bytes == 2 * cfg.num_hidden_layers * cfg.num_key_value_heads * head_dim * 4  # float32
    assert budget.attention_bytes == 2 * cfg.num_attention_heads * head_dim * 4
    capacity = 512  # 300 + 100 - 1 rounded up to KV_BUCKET (256)
    assert budget.batch_bytes(3, 300, 100) == (3 * capacity * (budget.kv_bytes + budget.attention_bytes)
                                               + 3 * budget.vocab_bytes + 300 * budget.prefill_bytes)
    assert budget.available() == 40 * GB  # the share (50 GB) less what the process holds (10 GB)
    # another process holds most of the card: what is free (plus this process's cache) is the bound
    crowded = MemoryBudget(model, 0.5, CPU, query=_reading(free=5 * GB, total=100 * GB, allocated=10 * GB,
                                                             reserved=12 * GB))
    assert crowded.available() == 7 * GB
    halved = MemoryBudget(model, 0.5, CPU, torch.bfloat16, query=_reading(0, 0, 0, 0))
    assert 2 * halved.kv_bytes == budget.kv_bytes  # the cache in the autocast dtype
    with pytest.raises(ValueError, match="fraction"):
        MemoryBudget(model, 1.5, CPU)


def test_batches_are_cut_to_the_memory_budget(tiny):
    """HFGenerator with a budget takes into a batch only the calls that fit what the budget leaves, and runs a call
    that alone does not fit alone; the tokens are those of the unbounded batches."""
    model, tok = tiny
    prompts = _prompts(6, seed=3)
    greedy = SamplingParams(temperature=0.0, max_tokens=6)
    probe = MemoryBudget(model, 1.0, CPU, query=_reading(0, 0, 0, 0))
    width = max(len(p) for p in prompts)
    room = probe.batch_bytes(2, width, 6)  # two rows of the widest prompt, not three
    assert probe.batch_bytes(3, width, 6) > room
    budgets = {"two rows": MemoryBudget(model, 0.5, CPU, query=_reading(free=100 * GB, total=2 * (GB + room),
                                                                       allocated=GB, reserved=GB)),
               "none fits": MemoryBudget(model, 0.5, CPU, query=_reading(free=100 * GB, total=2 * GB,
                                                                        allocated=GB, reserved=GB))}
    assert budgets["two rows"].available() == room and budgets["none fits"].available() == 0

    async def all_calls(gen):
        return await asyncio.gather(*(gen(p, greedy) for p in prompts))

    unbounded = HFGenerator(model, tok, CPU, max_batch_size=8)
    expected = [o.token_ids for o in asyncio.run(all_calls(unbounded))]
    assert max(unbounded.batch_sizes) > 2
    for name, budget in budgets.items():
        gen = HFGenerator(model, tok, CPU, max_batch_size=8, memory_budget=budget)
        assert [o.token_ids for o in asyncio.run(all_calls(gen))] == expected, name
        assert sum(gen.batch_sizes) == 6
        assert max(gen.batch_sizes) == (2 if name == "two rows" else 1), name

    def broken(_device):
        raise RuntimeError("CUDA error: the query failed")

    gen = HFGenerator(model, tok, CPU, max_batch_size=8, memory_budget=MemoryBudget(model, 0.5, CPU, query=broken))
    with pytest.raises(RuntimeError, match="query failed"):  # the waiting calls get the error, none hangs
        asyncio.run(all_calls(gen))

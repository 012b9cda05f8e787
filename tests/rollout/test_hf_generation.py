"""Batched Hugging Face generation (seal.rollout.hf_generation) on the tiny random Qwen2, against
transformers' own `generate` and the model's own forward pass."""

from __future__ import annotations

import asyncio
import random

import pytest
import torch

from seal.rollout.hf_generation import HFGenerator, generate_batch
from seal.rollout.types import SamplingParams

CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from seal.tiny_model import build_tiny_qwen2

    path = build_tiny_qwen2(tmp_path_factory.mktemp("tiny") / "model")
    return AutoModelForCausalLM.from_pretrained(path).eval(), AutoTokenizer.from_pretrained(path)


def _prompts(n: int, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(1000, 100_000) for _ in range(rng.randrange(20, 300))] for _ in range(n)]


def test_greedy_batch_equals_one_at_a_time_and_transformers_generate(tiny):
    from transformers import GenerationConfig

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
        ref = model.generate(torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                             generation_config=GenerationConfig(max_new_tokens=10, do_sample=False,
                                                                eos_token_id=gen.stop_ids, pad_token_id=gen.pad_id))
        assert out.token_ids == ref[0, len(prompt):].tolist()
        # log-probs: the model's own teacher-forced log-probabilities of the sampled tokens
        full = torch.tensor([prompt + out.token_ids])
        with torch.no_grad():
            logp = torch.log_softmax(model(full).logits[0, len(prompt) - 1:-1].float(), -1)
        expected = logp.gather(-1, torch.tensor(out.token_ids).unsqueeze(-1)).squeeze(-1)
        assert torch.allclose(torch.tensor(out.logprobs), expected, atol=1e-4)


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

"""One sampler: the local engine's vLLM generation (`ColocatedVLLM`) and evaluation's `vllm:` policy
(`seal.eval.policies.VLLMGenerator`) build the same `vllm.SamplingParams` for the same model and call: the same
stop tokens (the tokenizer's eos and the generation config's), the same per-call seed, the same log-prob and
detokenising settings. No engine is built here (`tests/eval/test_vllm_same_tokens.py` plays both for real)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

pytest.importorskip("vllm")

import torch  # noqa: E402
from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: E402

from seal.eval.policies import VLLMGenerator  # noqa: E402
from seal.models.smollm2 import build_smollm2  # noqa: E402
from seal.rollout.calls import call_seed, stop_token_ids  # noqa: E402
from seal.rollout.types import SamplingParams  # noqa: E402
from seal.rollout.vllm_generation import ColocatedVLLM, vllm_generation  # noqa: E402

FIELDS = ("temperature", "top_p", "top_k", "max_tokens", "seed", "logprobs", "stop_token_ids", "detokenize",
          "stop", "min_tokens", "repetition_penalty", "ignore_eos", "skip_special_tokens")


@pytest.fixture(scope="module")
def smollm2():
    path = build_smollm2()
    # as the local engine loads its actor (seal.engines.local.engine) and colocated_vllm reads its stop tokens
    tokenizer = AutoTokenizer.from_pretrained(str(path))
    model = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32)
    # evaluation's `vllm:` policy on the same directory (its engine is built on first use only)
    return path, tokenizer, model, VLLMGenerator(str(path), max_model_len=4096)


def _fields(sampling) -> dict:
    return {name: getattr(sampling, name) for name in FIELDS}


@pytest.mark.parametrize("params", [
    SamplingParams(temperature=0.0, top_p=1.0, top_k=-1, max_tokens=48),  # evaluation / validation: greedy
    SamplingParams(temperature=0.0, top_p=1.0, top_k=-1, max_tokens=48, seed=7),  # validation with its seed
    SamplingParams(temperature=1.0, top_p=0.9, top_k=20, max_tokens=512, seed=3),  # training sampling
])
def test_training_and_evaluation_build_the_same_vllm_sampling_params(smollm2, params):
    path, tokenizer, model, evaluation = smollm2
    training = SimpleNamespace(stop_ids=sorted(stop_token_ids(model, tokenizer)))  # what ColocatedVLLM holds
    for prompt in ([1, 2, 3], list(range(900))):
        ours = ColocatedVLLM._sampling(training, prompt, params)
        theirs = evaluation.sampling(prompt, params)
        assert _fields(ours) == _fields(theirs)
        # and what that is: the model's turn-closing token, the per-call seed, tokens with their log-probs
        assert tokenizer.eos_token_id in ours.stop_token_ids and tokenizer.eos_token == "<|im_end|>"
        assert ours.seed == (None if params.seed is None else call_seed(params.seed, len(prompt)))
        assert ours.logprobs == 0 and ours.detokenize is False


def test_an_aborted_call_is_an_error_in_both_paths():
    aborted = SimpleNamespace(token_ids=[1, 2], finish_reason="abort", logprobs=None)
    with pytest.raises(RuntimeError, match="finish_reason 'abort'"):
        vllm_generation(aborted)
    stopped = vllm_generation(SimpleNamespace(token_ids=[1, 2], finish_reason="stop", logprobs=None))
    assert stopped.token_ids == [1, 2] and stopped.finish_reason == "stop" and stopped.logprobs is None


def test_the_cpu_kv_cache_holds_one_full_sequence_besides_vllms_reserved_block(smollm2):
    from seal.rollout.vllm_generation import CPU_KV_RESERVED_TOKENS, cpu_kv_cache_bytes, kv_bytes_per_token

    path = smollm2[0]
    per_token = kv_bytes_per_token(path, "float32")
    # no memory to spare: still one 8192-token sequence plus the block vLLM keeps for itself
    tight = cpu_kv_cache_bytes(path, 8192, 1, available=0, dtype="float32")
    assert tight == per_token * (8192 + CPU_KV_RESERVED_TOKENS)
    roomy = cpu_kv_cache_bytes(path, 8192, 4, available=1 << 40, dtype="float32")
    assert roomy == per_token * 8192 * 4

"""What every generation backend (`hf_generation`, `vllm_generation`) does alike with one model call: its
seed, its stop tokens, settling its future. Torch-free on purpose: evaluation's model-free paths import the
vLLM engine settings, and with them this module, without loading torch."""

from __future__ import annotations

import concurrent.futures
from typing import Any


def call_seed(seed: int, prompt_len: int) -> int:
    """Seed of one model call: the episode's seed and the call's prompt length (grows every call)."""
    return (int(seed) * 1_000_003 + int(prompt_len)) % (2**63 - 1)


def stop_token_ids(model: Any, tokenizer: Any) -> list[int]:
    """The tokenizer's eos plus the model's generation eos ids (Qwen2.5: `<|im_end|>` and `<|endoftext|>`)."""
    stops = {int(tokenizer.eos_token_id)}
    gen_eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    if isinstance(gen_eos, int):
        stops.add(gen_eos)
    elif isinstance(gen_eos, (list, tuple)):
        stops.update(int(x) for x in gen_eos)
    return sorted(stops)


def settle(future: concurrent.futures.Future, result: Any = None, exc: BaseException | None = None) -> None:
    """Resolve a call's future unless its episode was cancelled meanwhile."""
    try:
        if exc is not None:
            future.set_exception(exc)
        else:
            future.set_result(result)
    except concurrent.futures.InvalidStateError:
        pass

"""The local engine's device and generation backend: where the models run, in which precision, and which engine
samples the episodes (batched Hugging Face decoding or a vLLM engine in this process)."""

from __future__ import annotations

import os
from typing import Any

import torch

from seal.recipe import RolloutConfig
from seal.rollout.hf_generation import HFGenerator, gpu_memory_budget
from seal.rollout.vllm_generation import ColocatedVLLM, colocated_vllm, vllm_cannot_run


def pick_device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def autocast_dtype(model_dtype: str, device: torch.device) -> torch.dtype | None:
    """Autocast dtype for `model.dtype`: weights and optimizer stay float32 (lr 1e-6 updates vanish in bf16
    weights); on a GPU the forward passes run in `model.dtype`. On CPU everything is float32."""
    if device.type != "cuda" or model_dtype == "float32":
        return None
    return torch.bfloat16 if model_dtype == "bfloat16" else torch.float16


# vLLM's tokens/s over batched HF generation's on CPU, measured with scripts/bench_generation.py (docs/engines.md,
# "Speed"): SmolLM2-135M, 8 episodes x 2 calls of ~1k-token prompts on a shared 2-core machine, the lower of two
# runs (8.1x and 10.2x; vLLM was also 3.1x and 6.9x HF one call at a time). `auto` takes vLLM on CPU only while
# this is above 1.
MEASURED_VLLM_SPEEDUP_CPU = 8.1


def choose_backend(rollout: RolloutConfig, model_path: str | os.PathLike[str], device: torch.device
                   ) -> tuple[str, str]:
    """`rollout.backend` resolved for this run: ("hf" or "vllm", why). `vllm` asked for where vLLM cannot run the
    model raises. `auto` is vllm wherever vLLM can run the model, except on CPU unless it was measured faster there
    (`MEASURED_VLLM_SPEEDUP_CPU`), and never with `rollout.deterministic_generation` (HF's one-call-at-a-time mode).
    On a GPU vLLM is taken whenever its GPU build is installed: batched HF measured ~280 generated tokens/s with 32
    rows of a 0.5B model on one H200 (docs/engines.md, "One GPU"), where vLLM's paged KV cache and continuous
    batching are its reason to exist."""
    asked = rollout.backend
    if asked == "hf":
        return "hf", "rollout.backend: hf"
    if asked == "vllm":
        problem = vllm_cannot_run(model_path, device.type)
        if problem:
            raise ValueError(f"rollout.backend: vllm, but {problem}; use rollout.backend hf or auto")
        return "vllm", "rollout.backend: vllm"
    # auto: the cheap reasons first (vllm_cannot_run imports vLLM, which takes seconds)
    if rollout.deterministic_generation:
        return "hf", "auto: rollout.deterministic_generation computes every call alone, with HF"
    if device.type == "cpu" and MEASURED_VLLM_SPEEDUP_CPU <= 1.0:
        return "hf", f"auto: vLLM measured {MEASURED_VLLM_SPEEDUP_CPU:.1f}x batched HF's tokens/s on cpu"
    problem = vllm_cannot_run(model_path, device.type)
    if problem:
        return "hf", f"auto: {problem}"
    if device.type == "cpu":
        return "vllm", (f"auto: vLLM runs this model and measured {MEASURED_VLLM_SPEEDUP_CPU:.1f}x batched HF's "
                        "tokens/s on cpu")
    return "vllm", f"auto: vLLM's {device.type} build is installed and runs this model"


def vllm_generator(rollout: RolloutConfig, seed: int, model_dtype: str, model: Any, tokenizer: Any,
                   path: str | os.PathLike[str], device: torch.device) -> ColocatedVLLM:
    """vLLM generation in this process, from the files the actor was loaded from: one sequence per episode in
    flight, the run's context window and seed."""
    return colocated_vllm(path, model, tokenizer, device.type, max_model_len=rollout.max_model_len,
                          max_num_seqs=rollout.concurrency, seed=seed, dtype=model_dtype,
                          gpu_memory_utilization=rollout.gpu_memory_utilization)


def hf_generator(rollout: RolloutConfig, model: Any, tokenizer: Any, device: torch.device,
                 autocast: torch.dtype | None) -> HFGenerator:
    """HF generation: concurrent episodes' calls batched, or one at a time with `deterministic_generation`; on a
    GPU the process is held to `rollout.hf_gpu_memory_fraction` of the card and batches are sized to fit in it."""
    return HFGenerator(model, tokenizer, device, autocast,
                       max_batch_size=1 if rollout.deterministic_generation else rollout.generation_batch_size,
                       max_batch_tokens=rollout.generation_batch_tokens,
                       memory_budget=gpu_memory_budget(model, device, rollout.hf_gpu_memory_fraction, autocast))

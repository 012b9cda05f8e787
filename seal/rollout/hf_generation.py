"""Token-level generation with a local Hugging Face causal LM (the ``GenerateFn`` of the local engine and of
``seal.evaluate --policy hf:<path>``): one sequence per call, token ids exactly as sampled."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import torch

from seal.rollout.types import Generation, SamplingParams


def call_seed(seed: int, prompt_len: int) -> int:
    """Seed of one model call: the episode's seed and the call's prompt length (grows every call)."""
    return (int(seed) * 1_000_003 + int(prompt_len)) % (2**63 - 1)


def autocast_context(device: torch.device, dtype: torch.dtype | None):
    if dtype is None or device.type != "cuda":
        return torch.autocast(device_type="cpu", enabled=False)
    return torch.autocast(device_type="cuda", dtype=dtype)


class HFGenerator:
    """`GenerateFn` over a Hugging Face causal LM: one sequence per call, token ids as sampled.

    Calls run in a worker thread (the event loop keeps serving the other episodes' HTTP traffic)
    and are serialised by a lock (one model). Sampling at `temperature` with top_p/top_k; greedy
    when temperature is 0. Stops on the tokenizer's eos and the model's generation eos ids (Qwen2.5:
    `<|im_end|>` and `<|endoftext|>`); the stop token is kept in `token_ids`.
    """

    def __init__(self, model: Any, tokenizer: Any, device: torch.device, autocast_dtype: torch.dtype | None = None):
        self.model = model
        self.tokenizer = tokenizer
        self.device = device
        self.autocast_dtype = autocast_dtype
        stops = {int(tokenizer.eos_token_id)}
        gen_eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
        if isinstance(gen_eos, int):
            stops.add(gen_eos)
        elif isinstance(gen_eos, (list, tuple)):
            stops.update(int(x) for x in gen_eos)
        self.stop_ids = sorted(stops)
        pad = tokenizer.pad_token_id
        self.pad_id = int(pad if pad is not None else tokenizer.eos_token_id)
        self.lock = threading.Lock()

    async def __call__(self, prompt_ids: list[int], params: SamplingParams) -> Generation:
        return await asyncio.to_thread(self.generate_sync, prompt_ids, params)

    def generate_sync(self, prompt_ids: list[int], params: SamplingParams) -> Generation:
        from transformers import GenerationConfig

        if not params.max_tokens:
            raise ValueError("SamplingParams.max_tokens must be set (the agent loop sets it)")
        greedy = params.temperature <= 0.0
        gen_cfg = GenerationConfig(
            max_new_tokens=int(params.max_tokens),
            do_sample=not greedy,
            temperature=None if greedy else float(params.temperature),
            top_p=None if greedy else float(params.top_p),
            top_k=None if greedy or params.top_k <= 0 else int(params.top_k),
            eos_token_id=self.stop_ids,
            pad_token_id=self.pad_id,
        )
        if not greedy and params.top_k <= 0:
            gen_cfg.top_k = 0  # HF: 0 disables top-k (the model's default would be 50)
        with self.lock, torch.no_grad(), autocast_context(self.device, self.autocast_dtype):
            if params.seed is not None:
                torch.manual_seed(call_seed(params.seed, len(prompt_ids)))
            inputs = torch.tensor([prompt_ids], dtype=torch.long, device=self.device)
            out = self.model.generate(inputs, attention_mask=torch.ones_like(inputs), generation_config=gen_cfg)
        ids = out[0, len(prompt_ids) :].tolist()
        if ids and ids[-1] in self.stop_ids:
            return Generation(ids, "stop")
        return Generation(ids, "length")

    @classmethod
    def from_pretrained(cls, path: str, device: str | None = None, dtype: str = "auto") -> HFGenerator:
        """Load a model directory; ``device`` None = CUDA when available; ``dtype`` a torch dtype name or auto."""
        from transformers import AutoModelForCausalLM, AutoTokenizer

        device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        torch_dtype = getattr(torch, dtype) if dtype != "auto" else "auto"
        tokenizer = AutoTokenizer.from_pretrained(path)
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch_dtype).to(device).eval()
        return cls(model, tokenizer, torch.device(device))

"""Tokens/s of the local engine's generation: concurrent episodes batched against one call at a time.

Each simulated episode makes `--calls` model calls through `seal.rollout.hf_generation.HFGenerator`
(the engine's `GenerateFn`): a prompt of about `--prompt-tokens` tokens, then after every call the
sampled tokens plus an `--observation-tokens` observation (random ids) are appended, after an
`--env-ms` pause standing in for the env service. The same episodes, seeds and sampling (temperature 1,
the training setting) run twice in one process, side by side: `max_batch_size=1` (one sequence at a
time, the deterministic mode) and `max_batch_size=--episodes` (the default). Target: >= 3x on CPU with
the tiny model, >= 10x at 32 episodes with `--model qwen0.5b --device cuda` (random weights with the
shape of Qwen2.5-0.5B, bf16; no download).

`--model smollm2` runs the real SmolLM2-135M-Instruct (`seal.models.smollm2`, built once into the model
cache); `--vllm` adds a third row: the same episodes, prompts, seeds and sampling through the local engine's
`rollout.backend: vllm` (`seal.rollout.vllm_generation.colocated_vllm`: vLLM in this process, float32 on CPU like
the actor, eager mode, prefix caching, a KV cache sized for the episodes), one run after a warm-up call. vLLM
needs the model as a directory: `--model smollm2`. Its row is what `rollout.backend: auto` is decided on
(`MEASURED_VLLM_SPEEDUP_CPU` in `seal/engines/local/backend.py`).

    python scripts/bench_generation.py [--episodes 32] [--calls 3] [--prompt-tokens 1024] [--max-tokens 32]
    python scripts/bench_generation.py --model qwen0.5b --device cuda --prompt-tokens 4096 --max-tokens 128
    python scripts/bench_generation.py --model smollm2 --vllm --episodes 32 --prompt-tokens 1024

The last lines read `speedup N.N×` (batched HF over one at a time) and, with `--vllm`, `vllm over batched
HF N.N×`.

Memory, per mode: on CUDA the peak of torch's allocated memory (live tensors) and of its reserved memory (the
caching allocator's blocks, what nvidia-smi sees less the CUDA context), from `torch.cuda.max_memory_allocated` /
`max_memory_reserved` reset before each mode; HF generation runs under `--memory-fraction` (the engine's
`rollout.hf_gpu_memory_fraction`: allocator cap and batch budget). On CPU torch has no such counters: the
column is the process's peak resident set size (VmHWM of /proc/self/status, reset before each mode through
/proc/self/clear_refs), model and Python included.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import time
from typing import Any

import torch

from seal.models.qwen25 import EOS_TOKEN_ID, PAD_TOKEN_ID, QWEN25_MODEL_VOCAB_SIZE, build_qwen_tokenizer
from seal.rollout.hf_generation import HFGenerator, gpu_memory_budget
from seal.rollout.types import Generation, SamplingParams


def build_model(kind: str, device: torch.device):
    """The tiny model of `exp/tiny_cpu.yaml` (float32) or a random Qwen2.5-0.5B-shaped one (bf16 on CUDA)."""
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    from seal.models.tiny import tiny_qwen2_config

    torch.manual_seed(0)
    if kind == "tiny":
        config = tiny_qwen2_config()
    else:  # Qwen2.5-0.5B-Instruct's shape (config.json of the Hub model)
        config = Qwen2Config(vocab_size=QWEN25_MODEL_VOCAB_SIZE, hidden_size=896, intermediate_size=4864,
                             num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2,
                             max_position_embeddings=32768, rope_theta=1000000.0, rms_norm_eps=1e-6,
                             tie_word_embeddings=True, bos_token_id=PAD_TOKEN_ID, eos_token_id=EOS_TOKEN_ID,
                             pad_token_id=PAD_TOKEN_ID)
    model = Qwen2ForCausalLM(config)
    model.generation_config = GenerationConfig(eos_token_id=[EOS_TOKEN_ID, PAD_TOKEN_ID], pad_token_id=PAD_TOKEN_ID)
    dtype = torch.bfloat16 if kind != "tiny" and device.type == "cuda" else torch.float32
    return model.to(device=device, dtype=dtype).eval()


def reset_peak_memory(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    else:
        with open("/proc/self/clear_refs", "w") as f:  # "5": reset the peak resident set size (Linux)
            f.write("5")


def peak_memory(device: torch.device) -> str:
    """The mode's peak memory, labelled (module docstring)."""
    if device.type == "cuda":
        return (f"allocated {torch.cuda.max_memory_allocated(device) / 2**30:.2f} GiB, "
                f"reserved {torch.cuda.max_memory_reserved(device) / 2**30:.2f} GiB")
    with open("/proc/self/status") as f:
        kib = next(int(line.split()[1]) for line in f if line.startswith("VmHWM:"))
    return f"peak RSS {kib / 2**20:.2f} GiB"


async def run_episodes(gen: Any, args: argparse.Namespace) -> tuple[float, list[list[Generation]]]:
    """All episodes concurrently; returns (wall seconds, each episode's generations)."""
    vocab = args.vocab  # ordinary tokens only (ids below the special tokens)

    async def episode(i: int) -> list[Generation]:
        rng = random.Random(i)
        ids = [rng.randrange(args.first_ordinary, vocab) for _ in range(args.prompt_tokens + rng.randrange(-64, 65))]
        outs = []
        for _ in range(args.calls):
            params = SamplingParams(temperature=1.0, max_tokens=args.max_tokens, seed=1000 + i)
            out = await gen(ids, params)
            outs.append(out)
            await asyncio.sleep(rng.uniform(0.5, 1.5) * args.env_ms / 1000.0)
            ids = ids + out.token_ids + [rng.randrange(args.first_ordinary, vocab)
                                         for _ in range(args.observation_tokens)]
        return outs

    t0 = time.perf_counter()
    results = await asyncio.gather(*(episode(i) for i in range(args.episodes)))
    return time.perf_counter() - t0, list(results)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=int, default=32)
    parser.add_argument("--calls", type=int, default=3, help="model calls per episode")
    parser.add_argument("--prompt-tokens", type=int, default=1024, help="first prompt (+-64)")
    parser.add_argument("--observation-tokens", type=int, default=48)
    parser.add_argument("--max-tokens", type=int, default=32, help="tokens per call")
    parser.add_argument("--env-ms", type=float, default=5.0, help="mean pause between calls (the env step)")
    parser.add_argument("--model", choices=["tiny", "qwen0.5b", "smollm2"], default="tiny")
    parser.add_argument("--vllm", action="store_true", help="also run the episodes through vLLM (--model smollm2)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=0, help="torch CPU threads (0 = torch's default)")
    parser.add_argument("--memory-fraction", type=float, default=0.9,
                        help="CUDA: share of the card the process may hold (rollout.hf_gpu_memory_fraction)")
    args = parser.parse_args()
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    if args.vllm and args.model != "smollm2":
        parser.error("--vllm needs a model directory: --model smollm2")
    model_dir = None
    if args.model == "smollm2":
        from transformers import AutoModelForCausalLM, AutoTokenizer

        from seal.models.smollm2 import build_smollm2

        model_dir = str(build_smollm2())
        tokenizer = AutoTokenizer.from_pretrained(model_dir)
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).to(device).eval()
        args.first_ordinary, args.vocab = 17, 49_152  # SmolLM2: ids 0-16 are its special tokens
    else:
        tokenizer = build_qwen_tokenizer()
        model = build_model(args.model, device)
        args.first_ordinary, args.vocab = 0, 150_000
    params_m = sum(p.numel() for p in model.parameters()) / 1e6
    print(f"model {args.model} ({params_m:.1f}M parameters, {next(model.parameters()).dtype}) on {device}, "
          f"{torch.get_num_threads()} CPU threads; {args.episodes} episodes x {args.calls} calls, prompt "
          f"~{args.prompt_tokens} tokens, {args.max_tokens} tokens per call, temperature 1")

    rows, outputs = [], {}
    budget = gpu_memory_budget(model, device, args.memory_fraction)  # None on CPU
    for name, batch in (("one at a time", 1), ("batched", args.episodes)):
        gen = HFGenerator(model, tokenizer, device, max_batch_size=batch, memory_budget=budget)
        asyncio.run(run_episodes(gen, argparse.Namespace(**{**vars(args), "episodes": 1, "calls": 1})))  # warm-up
        gen.batch_sizes.clear()
        reset_peak_memory(device)
        wall, outs = asyncio.run(run_episodes(gen, args))
        tokens = sum(len(o.token_ids) for ep in outs for o in ep)
        rows.append((name, len(gen.batch_sizes), statistics.mean(gen.batch_sizes), tokens, wall, tokens / wall,
                     peak_memory(device)))
        outputs[name] = outs

    pairs = [(a, b) for ea, eb in zip(outputs["one at a time"], outputs["batched"], strict=True)
             for a, b in zip(ea, eb, strict=True)]
    same = sum(a.token_ids == b.token_ids for a, b in pairs)
    if args.vllm:
        reset_peak_memory(device)
        wall, outs, steps = run_vllm(model_dir, model, tokenizer, args)
        tokens = sum(len(o.token_ids) for ep in outs for o in ep)
        rows.append(("vllm", f"{steps} steps", "-", tokens, wall, tokens / wall, peak_memory(device)))
    print("\n| mode | batches | rows per batch | tokens | wall s | tokens/s | peak memory |\n"
          "|---|---:|---:|---:|---:|---:|---|")
    for name, batches, mean_rows, tokens, wall, tps, memory in rows:
        shown = f"{mean_rows:.1f}" if isinstance(mean_rows, float) else mean_rows
        print(f"| {name} | {batches} | {shown} | {tokens} | {wall:.1f} | {tps:.1f} | {memory} |")
    print(f"\ncalls with identical tokens in both HF modes: {same}/{args.episodes * args.calls}")
    print(f"speedup {rows[1][5] / rows[0][5]:.1f}×")
    if args.vllm:
        print(f"vllm over batched HF {rows[2][5] / rows[1][5]:.1f}×")
    return 0


def run_vllm(model_dir: str, model: Any, tokenizer: Any, args: argparse.Namespace
             ) -> tuple[float, list[list[Generation]], int]:
    """The same episodes through the local engine's vLLM generation (built here, shut down after); also returns
    the engine steps the measured run took."""
    from seal.rollout.vllm_generation import colocated_vllm

    max_model_len = min(8192, args.prompt_tokens + 64 + args.calls * (args.max_tokens + args.observation_tokens) + 64)
    vgen = colocated_vllm(model_dir, model, tokenizer, args.device, max_model_len=max_model_len,
                          max_num_seqs=args.episodes)
    print(f"vllm: {vgen.describe()}")
    try:
        asyncio.run(run_episodes(vgen, argparse.Namespace(**{**vars(args), "episodes": 1, "calls": 1})))  # warm-up
        vgen.engine.reset_prefix_cache()  # the warm-up's prompt is episode 0's: no head start from its cache
        before = vgen.steps
        wall, outs = asyncio.run(run_episodes(vgen, args))
        return wall, outs, vgen.steps - before
    finally:
        vgen.close()


if __name__ == "__main__":
    raise SystemExit(main())

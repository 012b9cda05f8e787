"""Benchmark the agent loop against a real env service with a fixed-latency mock model.

    python scripts/bench_rollout.py                      # 32 train tasks x 8 = 256 concurrent episodes
    python scripts/bench_rollout.py --tasks 8 --repeats 4 --latency 0.2
    python scripts/bench_rollout.py --url http://127.0.0.1:8082   # use a running service

The mock model answers every call after `--latency` seconds (asyncio sleep: it costs no CPU) with the
task's ground truth: one `<tool_call>` per ground-truth call, then a plain reply closing each turn.
Reported:
- batch wall time vs the ideal (the longest episode's model calls x latency): the gap is what the
  env service, the client and the agent loop add on top of the model; target within 10%;
- the agent loop's own bookkeeping time per model call (templating, tokenising, masks; measured inside
  the loop), and this process's whole CPU time per call (loop + HTTP client + asyncio + the mock
  model, without the env service, which runs in its own process); target <= 2 ms.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from contextlib import ExitStack
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

import psutil  # noqa: E402

from seal.models.qwen25 import EOS_TOKEN_ID, build_qwen_tokenizer  # noqa: E402
from seal.rollout.client import EnvClient  # noqa: E402
from seal.rollout.codec import ChatCodec  # noqa: E402
from seal.rollout.episode import run_episode  # noqa: E402
from seal.rollout.types import Generation, RolloutLimits, SamplingParams  # noqa: E402


def replay_outputs(codec: ChatCodec, task_id: str) -> list[list[int]]:
    """Token ids of the ground-truth replay of `task_id`, one list per model call."""
    from env_service.tasks import ground_truth_replies

    return [codec.encode(t) + [EOS_TOKEN_ID] for t in ground_truth_replies(task_id)]


def mock_model(outputs: list[list[int]], latency: float):
    calls = 0

    async def generate(prompt_ids: list[int], params: SamplingParams) -> Generation:
        nonlocal calls
        ids = outputs[min(calls, len(outputs) - 1)]
        calls += 1
        await asyncio.sleep(latency)
        return Generation(ids, "stop")

    return generate


async def bench(urls: list[str], task_ids: list[str], repeats: int, latency: float, concurrency: int,
                profile: str | None = None, service_pids: list[int] | None = None) -> dict:
    tok = build_qwen_tokenizer()
    codec = ChatCodec.for_tokenizer(tok)
    scripts = {t: replay_outputs(codec, t) for t in task_ids}
    jobs = [t for t in task_ids for _ in range(repeats)]
    limits = RolloutLimits()
    gate = asyncio.Semaphore(concurrency)
    finished = 0

    async with EnvClient(urls, max_connections=max(concurrency, 16)) as client:
        await client.health()

        async def one(task_id: str):
            nonlocal finished
            async with gate:
                r = await run_episode(client, mock_model(scripts[task_id], latency), codec, task_id, "train",
                                      None, SamplingParams(), limits)
            finished += 1
            if finished % max(1, len(jobs) // 8) == 0:
                print(f"  {finished}/{len(jobs)} episodes done", flush=True)
            return r

        profiler = None
        if profile:
            import cProfile

            profiler = cProfile.Profile()
            profiler.enable()
        services = [psutil.Process(pid) for pid in service_pids or []]

        def service_cpu_s() -> float:
            return sum(sum(p.cpu_times()[:2]) for p in services)

        service_cpu0 = service_cpu_s()
        cpu0, wall0 = time.process_time(), time.perf_counter()
        rollouts = await asyncio.gather(*(one(t) for t in jobs))
        wall = time.perf_counter() - wall0
        cpu = time.process_time() - cpu0
        service_cpu = service_cpu_s() - service_cpu0 if services else None
        if profiler is not None:
            profiler.disable()
            profiler.dump_stats(profile)

    calls = sum(r.num_model_calls for r in rollouts)
    longest = max(r.num_model_calls for r in rollouts)
    ideal = longest * latency
    return {
        "replicas": len(urls),
        "episodes": len(rollouts),
        "concurrency": concurrency,
        "latency_s": latency,
        "model_calls": calls,
        "longest_episode_calls": longest,
        "wall_s": round(wall, 3),
        "ideal_s": round(ideal, 3),
        "overhead_pct": round(100 * (wall / ideal - 1), 1),
        "loop_bookkeeping_ms_per_call": round(1000 * sum(r.loop_time_s for r in rollouts) / calls, 3),
        "process_cpu_ms_per_call": round(1000 * cpu / calls, 3),
        "env_wait_ms_per_call": round(1000 * sum(r.env_time_s for r in rollouts) / calls, 2),
        "service_cpu_ms_per_call": round(1000 * service_cpu / calls, 3) if service_cpu is not None else None,
        "cpu_cores": os.cpu_count(),
        "mean_accuracy": round(sum(r.accuracy or 0.0 for r in rollouts) / len(rollouts), 3),
        "excluded": sum(r.excluded for r in rollouts),
        "truncated": sum(r.truncated for r in rollouts),
        "stop_reasons": {s: sum(r.stop_reason == s for r in rollouts) for s in {r.stop_reason for r in rollouts}},
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tasks", type=int, default=32, help="number of train-split tasks (first N)")
    p.add_argument("--repeats", type=int, default=8, help="episodes per task (GRPO group size)")
    p.add_argument("--latency", type=float, default=0.5, help="seconds per mock model call")
    p.add_argument("--concurrency", type=int, default=256)
    p.add_argument("--url", action="append", default=None,
                   help="use this running env service instead of starting one (repeat for replicas)")
    p.add_argument("--replicas", type=int, default=1, help="env service processes to start (without --url)")
    p.add_argument("--json", default=None, help="also write the results to this JSON file")
    p.add_argument("--profile", default=None, help="write a cProfile of the measured batch to this file")
    args = p.parse_args(argv)

    from env_service.tasks import split_ids

    task_ids = split_ids("train")[: args.tasks]
    print(f"{len(task_ids)} tasks x {args.repeats} episodes, {args.latency}s per model call, "
          f"concurrency {args.concurrency}", flush=True)
    with ExitStack() as stack:
        if args.url:
            urls, pids = list(args.url), []
        else:
            from env_service.process import running_service

            started = [stack.enter_context(running_service()) for _ in range(args.replicas)]
            urls, pids = [u for u, _ in started], [p.pid for _, p in started]
        result = asyncio.run(bench(urls, task_ids, args.repeats, args.latency, args.concurrency,
                                   args.profile, pids))
    for key, value in result.items():
        print(f"{key:32s} {value}")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())

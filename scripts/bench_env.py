"""Benchmark the env service: ground-truth replays over HTTP with N concurrent episodes.

Starts ``python -m env_service`` on a free loopback port (or uses ``--url``), replays the ground truth of the
eval split (one tool call per step as ``<tool_call>`` JSON, a plain reply to end each turn), and prints a table:
episodes/s, steps/s, p50/p99 latency per route, grading time, service RSS and RSS per open episode.

    python scripts/bench_env.py                      # concurrency 1, 8, 32 on the 400 eval tasks
    python scripts/bench_env.py --concurrency 32 --tasks 200
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import time
from collections import defaultdict
from pathlib import Path

import aiohttp
import httpx

REPO = Path(__file__).resolve().parent.parent

from env_service.process import running_service  # noqa: E402
from env_service.protocol import TOKEN_ENV  # noqa: E402
from env_service.tasks import ground_truth_replies, split_ids  # noqa: E402


def auth_headers() -> dict[str, str]:
    token = os.environ.get(TOKEN_ENV)
    return {"Authorization": f"Bearer {token}"} if token else {}


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    values = sorted(values)
    return values[min(len(values) - 1, int(round(q * (len(values) - 1))))]


async def replay_load(url: str, task_ids: list[str], concurrency: int) -> dict:
    latencies: dict[str, list[float]] = defaultdict(list)
    grade_ms: list[float] = []
    scores: list[float] = []
    steps = 0
    scripts = {tid: ground_truth_replies(tid) for tid in task_ids}
    queue = list(task_ids)
    # aiohttp, not httpx, generates the load: on 2 shared cores httpx's per-request CPU cost at 32 concurrent
    # connections dominates the measurement (measured: ~20 episodes/s from httpx vs ~150 from aiohttp).
    connector = aiohttp.TCPConnector(limit=concurrency)
    timeout = aiohttp.ClientTimeout(total=60)
    async with aiohttp.ClientSession(url, connector=connector, timeout=timeout, headers=auth_headers()) as client:

        async def timed(route: str, method: str, path: str, **kw) -> dict | None:
            t0 = time.perf_counter()
            async with client.request(method, path, **kw) as response:
                response.raise_for_status()
                body = await response.read()
            latencies[route].append((time.perf_counter() - t0) * 1000)
            return json.loads(body) if body else None

        async def worker() -> None:
            nonlocal steps
            while queue:
                tid = queue.pop()
                body = {"task_id": tid, "mode": "eval", "step_limit": {"scope": "episode", "max_steps": 200}}
                eid = (await timed("create", "POST", "/episodes", json=body))["episode_id"]
                for content in scripts[tid]:
                    await timed("step", "POST", f"/episodes/{eid}/step", json={"content": content})
                    steps += 1
                result = await timed("evaluate", "POST", f"/episodes/{eid}/evaluate")
                grade_ms.append(result["grade_ms"])
                scores.append(result["accuracy"])
                await timed("delete", "DELETE", f"/episodes/{eid}")

        t0 = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        wall = time.perf_counter() - t0
    return {
        "wall": wall,
        "episodes": len(scores),
        "steps": steps,
        "latencies": latencies,
        "grade_ms": grade_ms,
        "accuracy": sum(scores),
    }


async def rss_per_episode(url: str, task_ids: list[str], n: int) -> float:
    async with httpx.AsyncClient(base_url=url, timeout=60, headers=auth_headers()) as client:
        before = (await client.get("/stats")).json()["rss_bytes"]
        ids = []
        for i in range(n):
            body = {"task_id": task_ids[i % len(task_ids)], "mode": "eval"}
            ids.append((await client.post("/episodes", json=body)).json()["episode_id"])
        after = (await client.get("/stats")).json()["rss_bytes"]
        for eid in ids:
            await client.delete(f"/episodes/{eid}")
    return (after - before) / n / 2**20


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--url", default=None, help="an already running service (default: start one)")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--tasks", type=int, default=400, help="how many eval tasks to replay per setting")
    parser.add_argument("--rss-episodes", type=int, default=500)
    parser.add_argument("--service-args", default="", help="extra service arguments ('--workers 0')")
    args = parser.parse_args()

    def run(url: str) -> None:
        eval_ids = split_ids("eval")[: args.tasks]
        # RSS per open episode first, on the fresh service (later, freed arenas would absorb new episodes).
        ids = split_ids("all")
        base = [t for t in ids if "long_context" not in t]
        long = [t for t in ids if "long_context" in t]
        start_rss = httpx.get(f"{url}/stats", headers=auth_headers()).json()["rss_bytes"] / 2**20
        per = asyncio.run(rss_per_episode(url, base, args.rss_episodes))
        per_long = asyncio.run(rss_per_episode(url, long, args.rss_episodes))
        print(
            f"service RSS at start {start_rss:.0f} MB; RSS per open episode ({args.rss_episodes} open): "
            f"{per:.3f} MB (base/miss_func/miss_param), {per_long:.3f} MB (long_context)"
        )
        asyncio.run(replay_load(url, eval_ids[:20], 4))  # warm-up
        print(
            f"{'conc':>4} {'eps/s':>7} {'steps/s':>8} {'create p50/p99 ms':>18} {'step p50/p99 ms':>16} "
            f"{'eval p50/p99 ms':>16} {'grade p50 ms':>12} {'acc':>8}"
        )
        for c in args.concurrency:
            r = asyncio.run(replay_load(url, eval_ids, c))
            lat = r["latencies"]
            print(
                f"{c:>4} {r['episodes'] / r['wall']:>7.1f} {r['steps'] / r['wall']:>8.0f} "
                f"{pct(lat['create'], 0.5):>8.2f}/{pct(lat['create'], 0.99):<8.2f} "
                f"{pct(lat['step'], 0.5):>7.2f}/{pct(lat['step'], 0.99):<7.2f} "
                f"{pct(lat['evaluate'], 0.5):>7.2f}/{pct(lat['evaluate'], 0.99):<7.2f} "
                f"{statistics.median(r['grade_ms']):>12.2f} {int(r['accuracy']):>4}/{r['episodes']}"
            )
        rss = httpx.get(f"{url}/stats", headers=auth_headers()).json()["rss_bytes"] / 2**20
        print(f"service RSS after the runs: {rss:.0f} MB")

    if args.url:
        run(args.url)
    else:
        with running_service(args.service_args.split()) as (url, _):
            run(url)


if __name__ == "__main__":
    main()

"""Adversarial soak of the env service: fuzz every tool of every class under a health watchdog.

For a bounded time, concurrent episodes over all four categories call the tools of their task with extreme and
type-confused arguments (huge and negative numbers, 100 KB strings, nested lists, wrong types, missing and
unknown arguments), play known-expensive sequences (a directory DAG that doubles with every ``cp`` and is then
walked, repeated reads of a large file, thousands of messages, huge powers), and send malformed messages
(unclosed tags, deep nesting, garbage). Meanwhile a watchdog polls ``/healthz`` and ``/stats``. Prints a table:
episodes, steps, actions refused (over budget), worker restarts, 5xx replies, worst health latency and peak RSS.

    python scripts/soak_env.py                    # 45 s, 16 concurrent episodes, a fresh service
    python scripts/soak_env.py --seconds 20 --json out.json
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import aiohttp
import httpx

from env_service.parser import format_tool_call
from env_service.process import running_service
from env_service.protocol import TOKEN_ENV
from env_service.tasks import load_tasks, split_ids

REPO = Path(__file__).resolve().parent.parent


def auth_headers() -> dict[str, str]:
    token = os.environ.get(TOKEN_ENV)
    return {"Authorization": f"Bearer {token}"} if token else {}


def extreme(kind: str | None, rng: random.Random):
    """An extreme or type-confused value for a parameter of JSON-schema type ``kind``."""
    pool = [
        10**4000, -(10**4000), 2**63, -1, 0, 1e308, -1e308, 5e-324,
        "x" * 100_000, "", ("." * 2 + "/") * 50, "💥" * 1000, "\x00\n\t",
        [], [1] * 20_000, [[[[[[[[[[1]]]]]]]]]], {}, {"a": {"b": {"c": [1, 2, {"d": None}]}}},
        True, None, [{"error": "x"}] * 100,
    ]
    if kind in ("integer", "float", "number") and rng.random() < 0.5:
        return rng.choice([10**4000, 10**300, -(10**18), 99_999, 10_000, 2**31])
    if kind == "string" and rng.random() < 0.5:
        return rng.choice(["x" * 200_000, "a" * 10, "/" * 5000, "'" * 1000, "%s%n{0}" * 100])
    if kind in ("array", "list") and rng.random() < 0.5:
        return rng.choice([list(range(50_000)), ["x" * 1000] * 500, [[i] for i in range(5000)]])
    return rng.choice(pool)


def fuzz_call(doc: dict, rng: random.Random) -> tuple[str, dict]:
    props = (doc.get("parameters") or {}).get("properties") or {}
    args = {k: extreme((v or {}).get("type"), rng) for k, v in props.items() if rng.random() < 0.9}
    if rng.random() < 0.1:
        args["unexpected_arg"] = 1
    return doc["name"], args


def expensive_sequences(rng: random.Random) -> tuple[str | None, list[str]]:
    """(the BFCL class the sequence needs, or None; its messages)."""
    doubling = [("mkdir", {"dir_name": "d"})] + [
        c for i in range(30) for c in (("cp", {"source": "d", "destination": f"c{i}"}),
                                       ("mv", {"source": f"c{i}", "destination": "d"}))
    ]
    big = [format_tool_call("touch", {"file_name": "big"}),
           format_tool_call("echo", {"content": "y" * 900_000, "file_name": "big"})]
    return rng.choice([
        ("GorillaFileSystem", ["\n".join(format_tool_call(n, a) for n, a in doubling),
                               format_tool_call("find", {"path": "."})]),
        ("GorillaFileSystem", big + ["\n".join([format_tool_call("cat", {"file_name": "big"})] * 8)] * 3),
        ("MessageAPI", ["\n".join([format_tool_call("send_message", {"receiver_id": "USR002",
                                                                     "message": "m" * 10_000})] * 64)] * 5),
        ("MathAPI", [format_tool_call("power", {"base": 10**4000, "exponent": 9_999}),
                     format_tool_call("logarithm", {"value": 10**4000, "base": 3, "precision": 10_000})]),
        (None, ["<tool_call>" * 8000, "<tool_call>" + "[" * 200_000, '{"name": ' * 30_000, "</tool_call>" * 5000]),
    ])


class Watchdog:
    """Polls ``/healthz`` (timed) and ``/stats`` (peak RSS) every 0.1 s from a separate process, so that the
    soak's own CPU work (building megabyte bodies under the GIL) never shows up as service latency."""

    def __init__(self, url: str, workdir: Path) -> None:
        self.url, self.stop_file, self.out_file = url, workdir / "watch.stop", workdir / "watch.json"
        self.worst_health_s, self.health_failures, self.peak_rss, self.checks = 0.0, 0, 0, 0
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        self.proc = subprocess.Popen([sys.executable, __file__, "--watch", self.url, str(self.stop_file),
                                      str(self.out_file)], cwd=REPO)

    def join(self) -> None:
        self.stop_file.touch()
        assert self.proc is not None
        self.proc.wait(timeout=60)
        figures = json.loads(self.out_file.read_text())
        self.worst_health_s, self.health_failures = figures["worst_health_s"], figures["health_failures"]
        self.peak_rss, self.checks = figures["peak_rss"], figures["checks"]


def watch(url: str, stop_file: Path, out_file: Path) -> None:
    worst, failures, peak, checks = 0.0, 0, 0, 0
    with httpx.Client(timeout=10.0, headers=auth_headers()) as client:
        while not stop_file.exists():
            started = time.perf_counter()
            try:
                ok = client.get(f"{url}/healthz").status_code == 200
            except httpx.HTTPError:
                ok = False
            worst = max(worst, time.perf_counter() - started)
            failures += not ok
            checks += 1
            with contextlib.suppress(httpx.HTTPError, ValueError, KeyError):
                peak = max(peak, client.get(f"{url}/stats").json()["rss_bytes"])
            time.sleep(0.1)
    out_file.write_text(json.dumps({"worst_health_s": worst, "health_failures": failures, "peak_rss": peak,
                                    "checks": checks}))


async def soak(url: str, seconds: float, concurrency: int, seed: int) -> dict:
    rng = random.Random(seed)
    ids = split_ids("all")
    by_class: dict[str, list[str]] = {}
    for task in load_tasks().values():
        for name in task.involved_classes:
            by_class.setdefault(name, []).append(task.id)
    counts = {"episodes": 0, "steps": 0, "refused_steps": 0, "parse_errors": 0, "http_5xx": 0, "http_4xx": 0,
              "graded": 0}
    deadline = time.monotonic() + seconds
    timeout = aiohttp.ClientTimeout(total=120)
    async with aiohttp.ClientSession(url, timeout=timeout, headers=auth_headers()) as session:

        async def post(path: str, body: dict | None = None) -> dict | None:
            async with session.post(path, json=body) as response:
                text = await response.text()
                if response.status >= 500:
                    counts["http_5xx"] += 1
                    print(f"5xx on {path}: {text[:200]}")
                elif response.status >= 400:
                    counts["http_4xx"] += 1
                return json.loads(text) if response.status < 400 and text else None

        async def episode(worker_rng: random.Random) -> None:
            needs, script = expensive_sequences(worker_rng) if worker_rng.random() < 0.3 else (None, [])
            candidates = by_class.get(needs, ids) if needs else ids
            created = await post("/episodes", {"task_id": worker_rng.choice(candidates),
                                               "step_limit": {"scope": "episode", "max_steps": 20}})
            if created is None:
                return
            counts["episodes"] += 1
            eid, tools = created["episode_id"], created["tools"]
            for _ in range(worker_rng.randint(1, 12)):
                if script:
                    content = script.pop(0)
                else:
                    n = worker_rng.randint(1, 3)
                    content = "\n".join(format_tool_call(*fuzz_call(worker_rng.choice(tools), worker_rng))
                                        for _ in range(n))
                reply = await post(f"/episodes/{eid}/step", {"content": content[: (1 << 20) - 64]})
                if reply is None:
                    break
                counts["steps"] += 1
                counts["refused_steps"] += reply["info"]["error_type"] == "budget_exceeded"
                counts["parse_errors"] += reply["info"]["error_type"] == "parse_error"
                if reply["done"]:
                    break
            if await post(f"/episodes/{eid}/evaluate") is not None:
                counts["graded"] += 1
            async with session.delete(f"/episodes/{eid}"):
                pass

        async def worker(k: int) -> None:
            worker_rng = random.Random(rng.random() + k)
            while time.monotonic() < deadline:
                await episode(worker_rng)

        await asyncio.gather(*(worker(k) for k in range(concurrency)))
    return counts


def main(argv: list[str] | None = None) -> dict | None:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--watch"]:  # the watchdog process (Watchdog.start)
        watch(argv[1], Path(argv[2]), Path(argv[3]))
        return None
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", default=None, help="an already running service (default: start one)")
    parser.add_argument("--seconds", type=float, default=45.0)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--service-args", default="", help="extra service arguments ('--budget-wall-s 2')")
    parser.add_argument("--json", default=None, help="also write the figures to this file")
    args = parser.parse_args(argv)

    def run(url: str) -> dict:
        with tempfile.TemporaryDirectory() as workdir:
            watchdog = Watchdog(url, Path(workdir))
            watchdog.start()
            started = time.monotonic()
            try:
                counts = asyncio.run(soak(url, args.seconds, args.concurrency, args.seed))
            finally:
                watchdog.join()
        stats = httpx.get(f"{url}/stats", headers=auth_headers()).json()
        figures = {
            **counts,
            "wall_s": round(time.monotonic() - started, 1),
            "budget_refusals_total": stats["budget_refusals_total"],
            "worker_restarts_total": stats["worker_restarts_total"],
            "health_checks": watchdog.checks,
            "health_failures": watchdog.health_failures,
            "worst_health_ms": round(watchdog.worst_health_s * 1000, 1),
            "peak_rss_mb": round(watchdog.peak_rss / 2**20, 1),
            "final_rss_mb": round(stats["rss_bytes"] / 2**20, 1),
            "open_episodes_after": stats["open_episodes"],
        }
        width = max(map(len, figures))
        for key, value in figures.items():
            print(f"{key:<{width}}  {value}")
        return figures

    if args.url:
        figures = run(args.url)
    else:
        with running_service(args.service_args.split()) as (url, _):
            figures = run(url)
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=2))
    return figures


if __name__ == "__main__":
    main()

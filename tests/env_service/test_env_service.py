"""Integration tests: a real env service on a free loopback port, driven over HTTP."""

from __future__ import annotations

import asyncio
import json
import time

import httpx
import pytest

from env_service.parser import format_tool_call
from env_service.process import running_service
from env_service.tasks import (
    failing_twin_replies,
    ground_truth_replies,
    ground_truth_tool_calls,
    load_tasks,
    split_ids,
)

MF49 = "multi_turn_miss_func_49"  # BFCL's ground truth calls `tail` in turn 1; it is revealed in turn 3
WIDE = {"scope": "episode", "max_steps": 200}


async def replay(client: httpx.AsyncClient, task_id: str) -> dict:
    created = await client.post("/episodes", json={"task_id": task_id, "mode": "eval", "step_limit": WIDE})
    assert created.status_code == 201, created.text
    eid = created.json()["episode_id"]
    reply = None
    for turn in ground_truth_tool_calls(task_id):
        for call in turn:
            reply = (await client.post(f"/episodes/{eid}/step", json={"content": format_tool_call(**call)})).json()
            assert reply["observation"]["content"].startswith(("<tool_response>", "[ERROR]")), reply
        reply = (await client.post(f"/episodes/{eid}/step", json={"content": "Done."})).json()
    assert reply["done"] and reply["info"]["end_reason"] == "completed"
    result = (await client.post(f"/episodes/{eid}/evaluate")).json()
    assert (await client.delete(f"/episodes/{eid}")).status_code == 204
    return result


async def replay_all(url: str, task_ids: list[str], concurrency: int = 8) -> dict[str, dict]:
    results: dict[str, dict] = {}
    sem = asyncio.Semaphore(concurrency)
    async with httpx.AsyncClient(base_url=url, timeout=30) as client:

        async def one(tid: str) -> None:
            async with sem:
                results[tid] = await replay(client, tid)

        await asyncio.gather(*(one(t) for t in task_ids))
    return results


@pytest.mark.slow  # all 800 tasks replayed over HTTP
def test_ground_truth_replay_all_800_over_http(service_url):
    results = asyncio.run(replay_all(service_url, sorted(load_tasks())))
    assert len(results) == 800
    failed = {tid for tid, r in results.items() if r["accuracy"] != 1.0}
    assert failed == {MF49}, "only BFCL's own ground-truth anomaly may fail under strict availability"
    for tid, result in results.items():
        if tid == MF49:
            continue
        assert set(result["failure_tags"]) <= {"pass", "correct_abstention"}, tid
        assert set(result["paper_labels"]) == {"pass"}, tid
        assert result["progress"] == 1.0 and result["completed"]
    # the anomaly, named: turn 1's `tail` call is refused, so the turn's results miss it
    assert results[MF49]["failure_tags"][1] == "response_mismatch"


def test_miss_func_49_scores_under_official_availability():
    with running_service(["--no-strict-availability"]) as (url, _):
        results = asyncio.run(replay_all(url, [MF49, "multi_turn_miss_func_0"]))
    assert results[MF49]["accuracy"] == 1.0 and results["multi_turn_miss_func_0"]["accuracy"] == 1.0


def test_health_tasks_and_create_shape(service_url):
    health = httpx.get(f"{service_url}/healthz").json()
    assert health == {"status": "ok", "tasks": 800}
    for split, n in (("train", 400), ("eval", 400), ("all", 800)):
        ids = httpx.get(f"{service_url}/tasks", params={"split": split}).json()["task_ids"]
        assert len(ids) == n
    assert httpx.get(f"{service_url}/tasks", params={"split": "eval"}).json()["task_ids"] == split_ids("eval")
    created = httpx.post(
        f"{service_url}/episodes", json={"task_id": "multi_turn_miss_func_0", "mode": "eval"}
    )
    body = created.json()
    assert created.status_code == 201
    assert [m["role"] for m in body["messages"]] == ["system", "user"]
    system = body["messages"][0]["content"]
    assert system.startswith("# Tools\n\nYou may call one or more functions")
    assert system.endswith('{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>')
    assert '"name": "sort"' not in system  # held out until turn 3
    assert body["info"] == {
        "category": "multi_turn_miss_func",
        "num_turns": 5,
        "mode": "eval",
        "interface_version": 0,
        "step_limit": {"scope": "episode", "max_steps": 20},
        "rules": "release",
    }
    assert len(body["tools"]) == len(load_tasks()["multi_turn_miss_func_0"].tools)


def test_replay_serves_training_tasks_only(service_url):
    """The warm start's replays come over the wire, for training tasks; held-out ground truth never does."""
    train, held_out = split_ids("train")[0], split_ids("eval")[0]
    reply = httpx.get(f"{service_url}/tasks/{train}/replay")
    assert reply.status_code == 200, reply.text
    body = reply.json()
    assert body["task_id"] == train and body["ground_truth"] == ground_truth_replies(train)
    assert body["failing_twin"] == failing_twin_replies(train) != body["ground_truth"]
    refused = httpx.get(f"{service_url}/tasks/{held_out}/replay")
    assert refused.status_code == 403 and refused.json()["error"]["code"] == "held_out_task"
    unknown = httpx.get(f"{service_url}/tasks/multi_turn_base_9999/replay")
    assert unknown.status_code == 404 and unknown.json()["error"]["code"] == "unknown_task"


def test_isolation_32_concurrent_episodes(service_url):
    async def run() -> list[tuple[str, list[str]]]:
        async with httpx.AsyncClient(base_url=service_url, timeout=30) as client:

            async def one(i: int) -> tuple[str, list[str]]:
                eid = (await client.post("/episodes", json={"task_id": "multi_turn_base_0"})).json()[
                    "episode_id"
                ]
                await client.post(
                    f"/episodes/{eid}/step", json={"content": format_tool_call("mkdir", {"dir_name": f"d{i}"})}
                )
                await asyncio.sleep(0.01 * (i % 4))
                await client.post(
                    f"/episodes/{eid}/step", json={"content": format_tool_call("touch", {"file_name": f"f{i}"})}
                )
                reply = await client.post(f"/episodes/{eid}/step", json={"content": format_tool_call("ls", {})})
                listing = json.loads(reply.json()["observation"]["content"].split("\n")[1])
                await client.delete(f"/episodes/{eid}")
                return f"d{i}", listing["current_directory_content"]

            return await asyncio.gather(*(one(i) for i in range(32)))

    baseline = None
    for own_dir, listing in asyncio.run(run()):
        mine = {own_dir, "f" + own_dir[1:]}
        assert mine <= set(listing)
        others = set(listing) - mine
        baseline = others if baseline is None else baseline
        assert others == baseline  # everything else is the untouched scenario, identical for all 32
        assert not any(x.startswith(("d", "f")) and x[1:].isdigit() for x in others)


INJECTIONS = [
    "print('x') or len",
    "__import__('os').system('touch {sentinel}')",
    "_load_scenario",
    "__init__",
    "__class__",
    "eval",
    "exec",
    "open",
    "len",
    "GorillaFileSystem",
    "ls.__globals__",
    "ls; import os",
]


@pytest.mark.parametrize("name", INJECTIONS)
def test_injected_tool_names_are_refused(service_url, tmp_path, name):
    sentinel = tmp_path / "pwned"
    eid = httpx.post(f"{service_url}/episodes", json={"task_id": "multi_turn_base_0"}).json()["episode_id"]
    content = format_tool_call(
        name.format(sentinel=sentinel), {"folder": f"__import__('os').system('touch {sentinel}')"}
    )
    reply = httpx.post(f"{service_url}/episodes/{eid}/step", json={"content": content}).json()
    assert reply["info"]["error_type"] == "unavailable_tool"
    assert reply["observation"]["content"].startswith("[ERROR]")
    httpx.post(f"{service_url}/episodes/{eid}/step", json={"content": "done"})
    result = httpx.post(f"{service_url}/episodes/{eid}/evaluate").json()
    assert result["turns"][0]["model_calls"] == 0 and result["turns"][0]["unavailable_calls"] == 1
    assert not sentinel.exists()


def test_code_in_arguments_is_data(service_url, tmp_path):
    sentinel = tmp_path / "pwned"
    eid = httpx.post(f"{service_url}/episodes", json={"task_id": "multi_turn_base_0"}).json()["episode_id"]
    payload = f"__import__('os').system('touch {sentinel}')"
    reply = httpx.post(
        f"{service_url}/episodes/{eid}/step", json={"content": format_tool_call("cd", {"folder": payload})}
    ).json()
    assert reply["info"]["error_type"] == "tool_error"  # a folder with that odd name does not exist
    bad_key = format_tool_call("cd", {f"folder=1); __import__('os').system('touch {sentinel}'); (x": "a"})
    reply = httpx.post(f"{service_url}/episodes/{eid}/step", json={"content": bad_key}).json()
    assert reply["info"]["error_type"] == "parse_error"
    httpx.post(f"{service_url}/episodes/{eid}/step", json={"content": "done"})
    httpx.post(f"{service_url}/episodes/{eid}/evaluate")  # grading runs BFCL's checker on the accepted call
    assert not sentinel.exists()


def test_bad_requests_get_json_4xx_and_service_survives(service_url):
    def check(response: httpx.Response, status: int, code: str | None = None) -> None:
        assert response.status_code == status, response.text
        error = response.json()["error"]
        assert set(error) == {"code", "message"} and "Traceback" not in error["message"]
        if code:
            assert error["code"] == code

    url = service_url
    check(httpx.post(f"{url}/episodes/nope/step", json={"content": "x"}), 404, "unknown_episode")
    check(httpx.post(f"{url}/episodes/nope/evaluate"), 404)
    check(httpx.delete(f"{url}/episodes/nope"), 404)
    check(httpx.post(f"{url}/episodes", json={"task_id": "no_such_task"}), 404, "unknown_task")
    check(
        httpx.post(f"{url}/episodes", content=b"{not json", headers={"content-type": "application/json"}),
        400,
        "malformed_json",
    )
    check(httpx.post(f"{url}/episodes", json={"mode": "train"}), 422)
    check(httpx.post(f"{url}/episodes", json={"task_id": "multi_turn_base_0", "mode": "test"}), 422)
    check(httpx.post(f"{url}/episodes", json={"task_id": "multi_turn_base_0", "bogus": 1}), 422)
    check(
        httpx.post(
            f"{url}/episodes",
            json={"task_id": "multi_turn_base_0", "mode": "eval", "interface": {"error_feedback": True}},
        ),
        400,
        "interface_in_eval",
    )
    check(
        httpx.post(f"{url}/episodes", json={"task_id": "multi_turn_base_0", "interface": {"cues": "x"}}),
        422,
        "invalid_interface",
    )
    check(httpx.post(f"{url}/episodes", json={"task_id": "multi_turn_base_0", "episode_id": "../x"}), 422)
    check(httpx.post(f"{url}/episodes", content=b"x" * ((1 << 20) + 1)), 413, "body_too_large")
    check(httpx.get(f"{url}/tasks", params={"split": "dev"}), 400)
    check(httpx.get(f"{url}/no/such/route"), 404)
    check(httpx.put(f"{url}/healthz"), 405)

    eid = httpx.post(
        f"{url}/episodes", json={"task_id": "multi_turn_base_25", "episode_id": "fixed-1"}
    ).json()["episode_id"]
    check(httpx.post(f"{url}/episodes", json={"task_id": "multi_turn_base_25", "episode_id": "fixed-1"}), 409)
    check(httpx.post(f"{url}/episodes/{eid}/step", json={"content": 5}), 422)
    check(
        httpx.post(
            f"{url}/episodes/{eid}/step", content=b"[1,", headers={"content-type": "application/json"}
        ),
        400,
    )
    # garbage inside an assistant message is an observation for the model, never an HTTP error
    for garbage in [
        "\x00\ufffd<tool_call>",
        "</tool_call></tool_call>",
        "<tool_call>" * 1000,
        "🙂" * 5000,
        '<tool_call>{"name": "cat", "arguments": {"file_name": {"$ref": [1, [2, [3]]]}}}</tool_call>',
    ]:
        reply = httpx.post(f"{url}/episodes/{eid}/step", json={"content": garbage})
        assert reply.status_code == 200, reply.text
    for _ in range(30):  # run the episode out of steps
        if httpx.post(f"{url}/episodes/{eid}/step", json={"content": format_tool_call("pwd", {})}).json()["done"]:
            break
    check(httpx.post(f"{url}/episodes/{eid}/step", json={"content": "x"}), 409, "episode_finished")
    assert httpx.post(f"{url}/episodes/{eid}/evaluate").status_code == 200
    assert httpx.delete(f"{url}/episodes/{eid}").status_code == 204
    check(httpx.post(f"{url}/episodes/{eid}/step", json={"content": "x"}), 404)
    assert httpx.get(f"{url}/healthz").json()["status"] == "ok"


def test_ttl_expiry():
    with running_service(["--ttl", "0.5"]) as (url, _):
        eid = httpx.post(f"{url}/episodes", json={"task_id": "multi_turn_base_0"}).json()["episode_id"]
        assert (
            httpx.post(f"{url}/episodes/{eid}/step", json={"content": format_tool_call("pwd", {})}).status_code
            == 200
        )
        time.sleep(1.5)
        assert httpx.post(f"{url}/episodes/{eid}/step", json={"content": "x"}).status_code == 404
        assert httpx.get(f"{url}/stats").json()["expired_total"] == 1


def test_bearer_token():
    with running_service(["--token", "s3cret"]) as (url, _):
        assert httpx.get(f"{url}/healthz").status_code == 200
        assert httpx.get(f"{url}/tasks").status_code == 401
        assert httpx.get(f"{url}/tasks", headers={"authorization": "Bearer s3cret"}).status_code == 200


@pytest.mark.slow
def test_no_leak_over_5000_cycles():
    with running_service(["--allow-train-on-eval"]) as (url, _):  # it cycles eval-split tasks in training mode

        def rss() -> int:
            return httpx.get(f"{url}/stats").json()["rss_bytes"]

        async def cycles(n: int) -> None:
            ids = split_ids("eval")
            async with httpx.AsyncClient(base_url=url, timeout=30) as client:

                async def one(i: int) -> None:
                    eid = (await client.post("/episodes", json={"task_id": ids[i % len(ids)]})).json()[
                        "episode_id"
                    ]
                    await client.post(f"/episodes/{eid}/step", json={"content": format_tool_call("ls", {})})
                    await client.post(f"/episodes/{eid}/evaluate")
                    assert (await client.delete(f"/episodes/{eid}")).status_code == 204

                for start in range(0, n, 16):
                    await asyncio.gather(*(one(i) for i in range(start, min(n, start + 16))))

        asyncio.run(cycles(400))  # warm-up: imports, caches, allocator arenas
        start = rss()
        asyncio.run(cycles(5000))
        grown = rss() - start
        stats = httpx.get(f"{url}/stats").json()
        assert stats["open_episodes"] == 0
        assert grown < 50 * 2**20, f"RSS grew by {grown / 2**20:.1f} MB (from {start / 2**20:.1f} MB)"

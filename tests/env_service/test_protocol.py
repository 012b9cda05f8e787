"""The wire protocol's models against the real service (a subprocess on a free loopback port) and docs/protocol.md.

Run as a script (``python tests/env_service/test_protocol.py``) to capture the example exchange from a fresh service
and rewrite it in docs/protocol.md; ``test_docs_example_matches_a_real_exchange`` fails when the two drift apart.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest
from pydantic import BaseModel, ValidationError

from env_service import protocol as p
from env_service.parser import format_tool_call
from seal.core.evolve import CUE_TEXTS, EvolveConfig, evolve, initial_interface, validate_interface
from seal.core.profile import FailureProfile, TagProfile

REPO = Path(__file__).resolve().parents[2]
DOC = REPO / "docs" / "protocol.md"
TASK = "multi_turn_base_0"


def roundtrip(model: type[BaseModel], payload: Any) -> None:
    """The model parses the reply and dumps it back unchanged: no field unknown to it, none dropped or altered."""
    assert model.model_validate(payload).model_dump(mode="json") == payload


def post(url: str, path: str, body: Any = None) -> httpx.Response:
    return httpx.post(f"{url}{path}", json=body, timeout=30)


# ---------------------------------------------------------------------------------------------- replies


def test_models_round_trip_the_real_services_replies(service_url):
    url = service_url
    roundtrip(p.HealthReply, httpx.get(f"{url}/healthz").json())
    roundtrip(p.TasksReply, httpx.get(f"{url}/tasks", params={"split": "eval"}).json())
    roundtrip(p.StatsReply, httpx.get(f"{url}/stats").json())
    omega = {"version": 2, "schema": {"required": True, "enum": True}, "error_feedback": True,
             "cues": [{"tag": "state_mismatch", "text": CUE_TEXTS["state_mismatch"]}]}
    for mode, interface, task in (("train", omega, TASK), ("eval", None, "multi_turn_miss_func_0")):
        created = post(url, "/episodes", {"task_id": task, "mode": mode, "interface": interface})
        assert created.status_code == 201
        roundtrip(p.CreateReply, created.json())
        eid = created.json()["episode_id"]
        seen_errors = set()
        for content in (
            format_tool_call("ls", {}),
            format_tool_call("cd", {"folder": "no_such_folder"}),  # tool_error (with a hint in training)
            "<tool_call>{not json</tool_call>",  # parse_error
            format_tool_call("launch_rocket", {}),  # unavailable_tool
            "Done with this turn.",
        ):
            reply = post(url, f"/episodes/{eid}/step", {"content": content})
            assert reply.status_code == 200
            roundtrip(p.StepReply, reply.json())
            seen_errors.add(reply.json()["info"]["error_type"])
        assert seen_errors == {None, "tool_error", "parse_error", "unavailable_tool"}
        while not (reply := post(url, f"/episodes/{eid}/step", {"content": "ok"}).json())["done"]:
            roundtrip(p.StepReply, reply)
        roundtrip(p.StepReply, reply)
        assert reply["observation"] is None
        result = post(url, f"/episodes/{eid}/evaluate")
        roundtrip(p.EvaluateReply, result.json())
        assert result.json()["turns"] and result.json()["official"]["error_type"]
        assert httpx.delete(f"{url}/episodes/{eid}").status_code == 204
    for bad in (
        post(url, f"/episodes/{eid}/step", {"content": "x"}),
        httpx.get(f"{url}/nowhere"),
        post(url, "/episodes", {"task_id": TASK, "bogus": 1}),
    ):
        roundtrip(p.ErrorReply, bad.json())
        assert p.ERROR_STATUS[bad.json()["error"]["code"]] == bad.status_code


def test_reply_models_hold_the_protocols_invariants():
    message = {"role": "user", "content": "next"}
    info = {"error_type": None, "end_reason": None, "steps": 1}
    p.StepReply.model_validate({"observation": message, "done": False, "turn": 0, "info": info})
    with pytest.raises(ValidationError, match="observation is null but the episode is not done"):
        p.StepReply.model_validate({"observation": None, "done": False, "turn": 0, "info": info})
    with pytest.raises(ValidationError):
        p.StepReply.model_validate({"observation": None, "done": True, "turn": 0, "info": {**info, "error_type": "x"}})
    created = {"episode_id": "e", "tools": [], "messages": [{"role": "system", "content": "s"}, message],
               "info": {"category": "base", "num_turns": 1, "mode": "train", "interface_version": 0,
                        "step_limit": {"scope": "turn", "max_steps": 20}}}
    p.CreateReply.model_validate(created)
    with pytest.raises(ValidationError, match=r"\[system, user\]"):
        p.CreateReply.model_validate({**created, "messages": [message]})
    # Replies ignore fields they do not know (a newer service); requests refuse them (a caller's typo).
    assert p.HealthReply.model_validate({"status": "ok", "tasks": 1, "version": "2"}).model_dump() == {
        "status": "ok", "tasks": 1}
    with pytest.raises(ValidationError):
        p.StepRequest.model_validate({"content": "x", "contnet": "y"})


# ---------------------------------------------------------------------------------------------- requests

BAD_BODIES = [
    ("/episodes", {}, "task_id"),  # missing
    ("/episodes", {"task_id": TASK, "bogus": 1}, "bogus"),  # unknown
    ("/episodes", {"task_id": 5}, "task_id"),  # wrong type
    ("/episodes", {"task_id": TASK, "mode": "test"}, "mode"),
    ("/episodes", {"task_id": TASK, "interface": "raw"}, "interface"),
    ("/episodes", {"task_id": TASK, "step_limit": {"scope": "day"}}, "step_limit.scope"),
    ("/episodes", {"task_id": TASK, "step_limit": {"max_steps": 0}}, "step_limit.max_steps"),
    ("/episodes", {"task_id": TASK, "step_limit": {"max_steps": 5, "per": "turn"}}, "step_limit.per"),
    ("/episodes", {"task_id": "x" * 201}, "task_id"),
    ("/episodes", [TASK], "body"),
    ("STEP", {}, "content"),
    ("STEP", {"content": 5}, "content"),
    ("STEP", {"content": "x", "role": "assistant"}, "role"),
]


def test_unknown_missing_and_wrong_typed_fields_are_422_json_errors(service_url):
    eid = post(service_url, "/episodes", {"task_id": TASK}).json()["episode_id"]
    for path, body, field in BAD_BODIES:
        reply = post(service_url, f"/episodes/{eid}/step" if path == "STEP" else path, body)
        assert reply.status_code == 422, (body, reply.text)
        error = p.ErrorReply.model_validate(reply.json()).error
        assert error.code == "invalid_request" and error.message.startswith(field), (body, error.message)
    # the episode took none of those bodies as a step
    assert post(service_url, f"/episodes/{eid}/step", {"content": "hi"}).json()["info"]["steps"] == 1
    httpx.delete(f"{service_url}/episodes/{eid}")


def test_every_error_code_the_app_raises_has_its_status():
    app = (REPO / "env_service" / "app.py").read_text(encoding="utf-8")
    raised = set(re.findall(r'ApiError\(\s*"(\w+)"', app))
    assert raised and raised <= set(p.ERROR_STATUS)
    # the two Starlette errors and the catch-all are answered by code, too
    assert {"unauthorized", "body_too_large", "internal_error", "not_found", "method_not_allowed"} <= set(
        re.findall(r'"(\w+)"', app)) & set(p.ERROR_STATUS)
    assert all(400 <= status < 600 for status in p.ERROR_STATUS.values())


# ---------------------------------------------------------------------------------------------- Ω


def _profile(**tags: tuple[int, float, float]) -> FailureProfile:
    """A profile from tag=(count, prevalence, reward_mean)."""
    stats = {t: TagProfile(count=c, prevalence=prev, reward_mean=r, success_rate=0.0, pressure=prev * (1 - r))
             for t, (c, prev, r) in tags.items()}
    return FailureProfile(source="window", total_count=100, excluded_count=0, tags=stats)


def trainer_payloads() -> list[dict[str, Any]]:
    """What the trainer sends: Ω_0 of several configurations and the Ω that evolve makes of a bad profile."""
    out = []
    pressure = _profile(**{tag: (50, 0.5, 0.0) for tag in CUE_TEXTS})
    for vocabulary in ("progress", "paper"):
        for feedback in ("off", "on", "adaptive"):
            cfg = EvolveConfig(vocabulary=vocabulary, error_feedback=feedback, max_cues=p.MAX_CUES,
                               schema_types=feedback == "on")
            omega = initial_interface(cfg)
            out += [omega, evolve(omega, pressure, cfg)]
    return out


MALFORMED = [
    [],
    {"version": -1},
    {"version": True},
    {"schema": {"required": "yes"}},
    {"schema": {"require": True}},
    {"error_feedback": 1},
    {"cues": "be careful"},
    {"cues": [{"tag": "a", "text": "two\nlines"}]},
    {"cues": [{"tag": "a b", "text": "x"}]},
    {"cues": [{"tag": "a", "text": "x" * (p.MAX_CUE_TEXT_CHARS + 1)}]},
    {"cues": [{"tag": f"t{i}", "text": "x"} for i in range(p.MAX_CUES + 1)]},
    {"colour": "blue"},
]


def test_omega_has_one_rule_set_on_both_sides(service_url):
    def create(interface: Any) -> httpx.Response:
        return post(service_url, "/episodes", {"task_id": TASK, "interface": interface})

    def accepted(interface: Any) -> int:
        reply = create(interface)
        assert reply.status_code == 201, reply.text
        httpx.delete(f"{service_url}/episodes/{reply.json()['episode_id']}")
        return reply.json()["info"]["interface_version"]

    # A payload the trainer emits is accepted by the service as is.
    payloads = trainer_payloads()
    assert any(o["cues"] for o in payloads) and any(o["error_feedback"] for o in payloads)
    for omega in payloads:
        assert validate_interface(omega) == omega == p.parse_omega(omega).to_dict()
        assert accepted(omega) == omega["version"]
    # ... and vice versa: what the service accepts, the trainer accepts, read the same way.
    for partial in ({}, {"version": 4}, {"schema": {"enum": True}}, {"cues": None, "error_feedback": None}):
        assert accepted(partial) == partial.get("version", 0)
        assert validate_interface(partial) == p.parse_omega(partial).to_dict()
    # A malformed Ω is refused by both, with the same message.
    for bad in MALFORMED:
        with pytest.raises(p.InterfaceError) as refused:
            validate_interface(bad)
        reply = create(bad)
        if isinstance(bad, list):  # not an object: refused by the request model before Ω's rules
            assert reply.status_code == 422 and reply.json()["error"]["code"] == "invalid_request"
            assert isinstance(refused.value, TypeError)
            continue
        assert reply.status_code == 422, bad
        assert reply.json() == {"error": {"code": "invalid_interface", "message": str(refused.value)}}


def test_interface_model_is_frozen_and_complete():
    omega = p.parse_omega({"cues": [{"tag": "t", "text": "  padded  "}]})
    assert omega.cues == (p.Cue("t", "padded"),)
    assert omega.to_dict() == {"version": 0, "schema": dict.fromkeys(p.SCHEMA_KEYS, False), "error_feedback": False,
                               "cues": [{"tag": "t", "text": "padded"}]}
    assert tuple(omega.to_dict()) == p.INTERFACE_KEYS
    with pytest.raises(AttributeError):
        omega.version = 1  # type: ignore[misc]
    with pytest.raises(p.InterfaceTypeError):
        p.parse_omega(None)  # null is "no interface" in a request, not an Ω


# ---------------------------------------------------------------------------------------------- docs

EXAMPLE_ID = "example-1"
EXAMPLE_OMEGA = {"version": 3, "schema": {"required": True}, "error_feedback": True,
                 "cues": [{"tag": "state_mismatch", "text": CUE_TEXTS["state_mismatch"]}]}
# (method, path, body, reply model); the steps: a tool call, a failing call (with φ_err's hint), a plain reply
# that ends turn 0.
EXCHANGE: list[tuple[str, str, Any, type[BaseModel] | None]] = [
    ("POST", "/episodes", {"task_id": TASK, "mode": "train", "episode_id": EXAMPLE_ID, "interface": EXAMPLE_OMEGA},
     p.CreateReply),
    ("POST", f"/episodes/{EXAMPLE_ID}/step", {"content": format_tool_call("pwd", {})}, p.StepReply),
    ("POST", f"/episodes/{EXAMPLE_ID}/step", {"content": format_tool_call("cd", {"folder": "reports"})}, p.StepReply),
    ("POST", f"/episodes/{EXAMPLE_ID}/step", {"content": "I am in the workspace folder."}, p.StepReply),
    ("POST", f"/episodes/{EXAMPLE_ID}/evaluate", None, p.EvaluateReply),
    ("DELETE", f"/episodes/{EXAMPLE_ID}", None, None),
    ("POST", f"/episodes/{EXAMPLE_ID}/step", {"content": "Hello?"}, p.ErrorReply),
]
BEGIN, END = "<!-- example exchange: begin -->", "<!-- example exchange: end -->"
MAX_SHOWN_CHARS = 160


def shorten(value: Any, key: str = "") -> Any:
    """Long texts cut to MAX_SHOWN_CHARS (with the count of what is left out), only the first tool doc kept."""
    if key == "tools" and isinstance(value, list):
        return [shorten(v) for v in value[:1]]
    if isinstance(value, str) and len(value) > MAX_SHOWN_CHARS + 40:
        return f"{value[:MAX_SHOWN_CHARS]}... [{len(value) - MAX_SHOWN_CHARS} more characters]"
    if isinstance(value, list):
        return [shorten(v) for v in value]
    if isinstance(value, dict):
        return {k: shorten(v, k) for k, v in value.items()}
    return value


def capture(url: str) -> str:
    """Play EXCHANGE against the service at `url` and render it as the markdown docs/protocol.md shows."""
    parts = [BEGIN]
    with httpx.Client(base_url=url, timeout=30) as client:
        for method, path, body, _model in EXCHANGE:
            reply = client.request(method, path, json=body)
            parts.append(f"`{method} {path}`" + (":" if body is not None else " (no body)"))
            if body is not None:
                parts.append(f"```json\n{json.dumps(body, indent=2, ensure_ascii=False)}\n```")
            if reply.status_code == 204:
                parts.append(f"→ {reply.status_code}, no body")
                continue
            payload = shorten(reply.json())
            parts.append(f"→ {reply.status_code}\n```json\n{json.dumps(payload, indent=2, ensure_ascii=False)}\n```")
    parts.append(END)
    return "\n\n".join(parts)


def documented_example() -> str:
    text = DOC.read_text(encoding="utf-8")
    return text[text.index(BEGIN):text.index(END) + len(END)]


def _mask_timing(text: str) -> str:
    return re.sub(r'"grade_ms": [0-9.e+-]+', '"grade_ms": 0', text)


def test_docs_example_matches_a_real_exchange(service_url):
    documented = documented_example()
    assert _mask_timing(capture(service_url)) == _mask_timing(documented), (
        "docs/protocol.md's example is stale: run `python tests/env_service/test_protocol.py` to capture it again")
    blocks = [json.loads(b) for b in re.findall(r"```json\n(.*?)\n```", documented, re.S)]
    requests = [body for _, _, body, _ in EXCHANGE if body is not None]
    replies = [model for _, _, _, model in EXCHANGE if model is not None]
    assert len(blocks) == len(requests) + len(replies)
    shown_requests, shown_replies = [], []  # in the order shown: each request's body, then its reply
    for _method, _path, body, model in EXCHANGE:
        if body is not None:
            shown_requests.append(blocks.pop(0))
        if model is not None:
            shown_replies.append(blocks.pop(0))
    assert shown_requests == requests
    p.CreateRequest.model_validate(requests[0])
    for request in requests[1:]:
        p.StepRequest.model_validate(request)
    for model, shown in zip(replies, shown_replies, strict=True):
        roundtrip(model, shown)


def _doc_sections() -> dict[str, str]:
    text = DOC.read_text(encoding="utf-8")
    return {m.group(1): m.group(2) for m in re.finditer(r"^#### `(\w+)`\n(.*?)(?=^#|\Z)", text, re.S | re.M)}


def test_docs_describe_every_route_field_and_error_code():
    text = DOC.read_text(encoding="utf-8")
    for route in p.ROUTES:
        assert f"`{route}`" in text, route
    sections = _doc_sections()
    models = [m for m in vars(p).values() if isinstance(m, type) and issubclass(m, BaseModel)
              and m.__module__ == p.__name__ and not m.__name__.startswith("_")]
    assert len(models) > 15
    for model in models:
        assert model.__name__ in sections, f"docs/protocol.md has no section for {model.__name__}"
        rows = re.findall(r"^\| `(\w+)` \|", sections[model.__name__], re.M)
        assert rows == list(model.model_fields), model.__name__
    for omega_model in (p.Interface, p.SchemaSwitches, p.Cue):
        rows = re.findall(r"^\| `(\w+)` \|", sections[omega_model.__name__], re.M)
        assert rows == list(omega_model.__dataclass_fields__), omega_model.__name__
    table = dict(re.findall(r"^\| `(\w+)` \| (\d{3}) \|", text, re.M))
    assert {k: int(v) for k, v in table.items()} == p.ERROR_STATUS
    assert f"| `{p.HTTP_ERROR}` |" in text


if __name__ == "__main__":
    from env_service.process import running_service

    with running_service() as (service, _proc):
        example = capture(service)
    text = DOC.read_text(encoding="utf-8")
    DOC.write_text(text[:text.index(BEGIN)] + example + text[text.index(END) + len(END):], encoding="utf-8")
    print(f"wrote the example exchange into {DOC.relative_to(REPO)}", file=sys.stderr)

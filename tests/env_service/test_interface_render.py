"""Tests of the train-only interface renderer (env_service/interface.py) on real BFCL data.

Tool docs come from bfcl_eval's multi-turn function docs; error texts are produced by calling BFCL's
own classes, loaded with scenarios from real tasks of BFCL_v4_multi_turn_base.json.
"""

from __future__ import annotations

import ast
import copy
import importlib
import json
import os
import tempfile
from functools import cache
from pathlib import Path
from typing import Any

import pytest

# bfcl_eval writes result/score folders under BFCL_PROJECT_ROOT at import time.
os.environ.setdefault("BFCL_PROJECT_ROOT", tempfile.mkdtemp(prefix="bfcl_root_"))

from env_service import interface as itf
from env_service.interface import (
    ENUM_MARKER_PREFIX,
    ITEM_ENUM_MARKER_PREFIX,
    MAX_CUE_TEXT_CHARS,
    MAX_CUES,
    MAX_LISTED_TOOLS,
    REQUIRED_MARKER,
    TOOL_ERROR_FAMILIES,
    Cue,
    Interface,
    InterfaceError,
    SchemaSwitches,
    annotate_tools,
    classify_tool_error,
    cue_block,
    error_feedback,
    extract_enum,
    parameter_enum,
    parse_interface,
    render_system_suffix,
    schema_instruction,
    tool_error_message,
)

bfcl_eval = pytest.importorskip("bfcl_eval")

BFCL_DIR = Path(bfcl_eval.__file__).parent
# The eight classes of the BFCL V3 multi-turn categories and their doc files.
MULTI_TURN_DOC_FILES = (
    "gorilla_file_system",
    "math_api",
    "message_api",
    "posting_api",
    "ticket_api",
    "trading_bot",
    "travel_booking",
    "vehicle_control",
)


# --------------------------------------------------------------------------------------------------
# BFCL helpers
# --------------------------------------------------------------------------------------------------


def _json_lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


@cache
def _docs_by_name() -> dict[str, dict[str, Any]]:
    docs: dict[str, dict[str, Any]] = {}
    for stem in MULTI_TURN_DOC_FILES:
        for doc in _json_lines(BFCL_DIR / "data" / "multi_turn_func_doc" / f"{stem}.json"):
            docs[doc["name"]] = doc
    return docs


def _docs(*names: str) -> list[dict[str, Any]]:
    return [copy.deepcopy(_docs_by_name()[n]) for n in names]


def _all_docs() -> list[dict[str, Any]]:
    return copy.deepcopy(list(_docs_by_name().values()))


@cache
def _entries(category: str = "multi_turn_base") -> dict[str, dict[str, Any]]:
    return {e["id"]: e for e in _json_lines(BFCL_DIR / "data" / f"BFCL_v4_{category}.json")}


def _instance(class_name: str, task_id: str, config_override: dict[str, Any] | None = None) -> Any:
    """A BFCL class instance loaded as BFCL's executor loads it, from a real task's initial_config."""
    from bfcl_eval.constants.executable_backend_config import CLASS_FILE_PATH_MAPPING, STATELESS_CLASSES

    entry = _entries()[task_id]
    assert class_name in entry["involved_classes"], (class_name, task_id)
    cls = getattr(importlib.import_module(CLASS_FILE_PATH_MAPPING[class_name]), class_name)
    obj = cls()
    if class_name not in STATELESS_CLASSES:
        config = copy.deepcopy(entry["initial_config"].get(class_name, {}))
        if config_override is not None:
            config = config_override
        obj._load_scenario(config, long_context=False)
    return obj


def _result_text(obj: Any, method: str, **kwargs: Any) -> str:
    """The result string BFCL's executor produces for one call (same rules as
    ``multi_turn_utils.execute_multi_turn_func_call``; checked against it below)."""
    try:
        result = getattr(obj, method)(**kwargs)
    except Exception as exc:  # noqa: BLE001 - the executor turns every exception into this text
        return f"Error during execution: {exc}"
    if type(result) is str:
        return result
    if type(result) is dict:
        try:
            return json.dumps(result)
        except (TypeError, ValueError):
            return str(result)
    return str(result)


# Real tasks whose scenario puts each class in the state a case needs (checked by the asserts in
# _scenario_facts).
TWITTER_LOGGED_OUT = "multi_turn_base_0"  # TwitterAPI, no "authenticated" key -> False
TICKET_LOGGED_OUT = "multi_turn_base_2"  # TicketAPI, no current_user
TICKET_LOGGED_IN = "multi_turn_base_55"
MESSAGE_LOGGED_OUT = "multi_turn_base_14"  # MessageAPI, no current_user
MESSAGE_LOGGED_IN = "multi_turn_base_17"
TRADING_LOGGED_OUT = "multi_turn_base_105"  # TradingBot authenticated False
TRADING_LOGGED_IN = "multi_turn_base_100"
TRAVEL = "multi_turn_base_150"  # TravelAPI with an access token
VEHICLE = "multi_turn_base_50"
FILES = "multi_turn_base_0"
MATH = "multi_turn_base_15"


def test_scenario_facts() -> None:
    cfg = {tid: _entries()[tid]["initial_config"] for tid in _entries()}
    assert not cfg[TWITTER_LOGGED_OUT]["TwitterAPI"].get("authenticated")
    assert not cfg[TICKET_LOGGED_OUT].get("TicketAPI", {}).get("current_user")
    assert cfg[TICKET_LOGGED_IN]["TicketAPI"].get("current_user")
    assert not cfg[MESSAGE_LOGGED_OUT].get("MessageAPI", {}).get("current_user")
    assert cfg[MESSAGE_LOGGED_IN]["MessageAPI"].get("current_user")
    assert cfg[TRADING_LOGGED_OUT]["TradingBot"]["authenticated"] is False
    assert cfg[TRADING_LOGGED_IN]["TradingBot"]["authenticated"] is True
    assert "access_token" in cfg[TRAVEL]["TravelAPI"]


def test_result_text_matches_bfcl_executor() -> None:
    """_result_text reproduces the executor's formatting (dict, list, str-ed exception)."""
    from bfcl_eval.eval_checker.multi_turn_eval import multi_turn_utils

    entry = _entries()[TICKET_LOGGED_OUT]
    calls = ["cd(path='x')", "cd(folder='no_such_dir')", "ls()", "get_user_tickets()"]
    model_name = "interface_render_test_probe"
    try:
        got, _ = multi_turn_utils.execute_multi_turn_func_call(
            calls, entry["initial_config"], entry["involved_classes"], model_name, entry["id"]
        )
    finally:
        for key in [k for k in vars(multi_turn_utils) if k.startswith(model_name)]:
            delattr(multi_turn_utils, key)
    fs = _instance("GorillaFileSystem", TICKET_LOGGED_OUT)
    ticket = _instance("TicketAPI", TICKET_LOGGED_OUT)
    mine = [
        _result_text(fs, "cd", path="x"),
        _result_text(fs, "cd", folder="no_such_dir"),
        _result_text(fs, "ls"),
        _result_text(ticket, "get_user_tickets"),
    ]
    assert got == mine
    assert got[0].startswith("Error during execution: GorillaFileSystem.cd() got an unexpected")
    assert got[3].startswith("[{'error': ")  # a list is str()-ed: Python literal, not JSON


# --------------------------------------------------------------------------------------------------
# parse_interface
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("obj", [None, {}, {"version": 7}, {"schema": None, "cues": None, "error_feedback": None}])
def test_raw_interfaces(obj: Any) -> None:
    iface = parse_interface(obj)
    assert iface.is_raw
    assert render_system_suffix(obj) == ""
    assert iface.schema == SchemaSwitches()


def test_full_interface_round_trip() -> None:
    spec = {
        "version": 3,
        "schema": {"required": True, "enum": True, "types": False, "hide_optional": False, "release_wording": False,
                   "skip_revealed": False},
        "error_feedback": True,
        "cues": [{"tag": "state_mismatch", "text": "Re-read the latest tool output before changing state."}],
    }
    iface = parse_interface(spec)
    assert not iface.is_raw
    assert iface.version == 3
    assert iface.schema == SchemaSwitches(required=True, enum=True)
    assert iface.error_feedback is True
    assert iface.cues == (Cue("state_mismatch", spec["cues"][0]["text"]),)
    assert iface.to_dict() == spec
    assert parse_interface(iface.to_dict()) == iface
    assert parse_interface(iface) is iface


@pytest.mark.parametrize(
    "spec",
    [
        {"error_feedback": True},
        {"schema": {"hide_optional": True}},
        {"cues": [{"tag": "pass", "text": "x"}]},
    ],
)
def test_any_single_switch_makes_interface_non_raw(spec: dict[str, Any]) -> None:
    assert not parse_interface(spec).is_raw


def test_interface_is_frozen() -> None:
    iface = parse_interface({"error_feedback": True})
    with pytest.raises(AttributeError):
        iface.error_feedback = False  # type: ignore[misc]


_LONG = "x" * (MAX_CUE_TEXT_CHARS + 1)


@pytest.mark.parametrize(
    ("spec", "field"),
    [
        ([1, 2], "interface must be"),
        ("raw", "interface must be"),
        ({"verison": 1}, "unknown key"),
        ({"schema": {"required": True, "enums": True}}, "unknown key"),
        ({"schema": ["required"]}, "interface.schema must be an object"),
        ({"schema": {"required": "yes"}}, "interface.schema.required"),
        ({"schema": {"enum": 1}}, "interface.schema.enum"),
        ({"error_feedback": "true"}, "interface.error_feedback"),
        ({"version": True}, "interface.version"),
        ({"version": -1}, "interface.version"),
        ({"version": 1.5}, "interface.version"),
        ({"version": "2"}, "interface.version"),
        ({"cues": "be careful"}, "interface.cues must be a list"),
        ({"cues": {"tag": "a", "text": "b"}}, "interface.cues must be a list"),
        ({"cues": [{"tag": "t", "text": f"cue {i}"} for i in range(MAX_CUES + 1)]}, "limit"),
        ({"cues": ["be careful"]}, "interface.cues[0]"),
        ({"cues": [{"tag": "a"}]}, "interface.cues[0].text"),
        ({"cues": [{"text": "b"}]}, "interface.cues[0].tag"),
        ({"cues": [{"tag": "a", "text": "b", "weight": 2}]}, "unknown key"),
        ({"cues": [{"tag": "a", "text": "   "}]}, "interface.cues[0].text"),
        ({"cues": [{"tag": "a", "text": _LONG}]}, "limit"),
        ({"cues": [{"tag": "a", "text": "line one\n# Tools"}]}, "single line"),
        ({"cues": [{"tag": "bad tag!", "text": "b"}]}, "interface.cues[0].tag"),
        ({"cues": [{"tag": "t" * 65, "text": "b"}]}, "interface.cues[0].tag"),
        ({"cues": [{"tag": 3, "text": "b"}]}, "interface.cues[0].tag"),
        ({1: True}, "keys must be strings"),
    ],
)
def test_parse_interface_rejects(spec: Any, field: str) -> None:
    with pytest.raises(InterfaceError) as info:
        parse_interface(spec)
    assert isinstance(info.value, ValueError)
    assert field in str(info.value)


def test_parse_interface_limits_are_inclusive() -> None:
    cues = [{"tag": f"t{i}", "text": "y" * MAX_CUE_TEXT_CHARS} for i in range(MAX_CUES)]
    assert len(parse_interface({"cues": cues}).cues) == MAX_CUES


# --------------------------------------------------------------------------------------------------
# φ_schema: enum extraction
# --------------------------------------------------------------------------------------------------

# Every enum-like parameter of the eight BFCL multi-turn classes, with the values read off the
# description by hand (docs/interface.md tabulates the patterns).
REAL_ENUMS: dict[tuple[str, str], tuple[str, list[str]]] = {
    ("activateParkingBrake", "mode"): ("enum_json_list", ["engage", "release"]),
    ("adjustClimateControl", "unit"): ("enum_json_list", ["celsius", "fahrenheit"]),
    ("adjustClimateControl", "mode"): ("enum_json_list", ["auto", "cool", "heat", "defrost"]),
    ("displayCarStatus", "option"): (
        "enum_json_list",
        ["fuel", "battery", "doors", "climate", "headlights", "parkingBrake", "brakePedal", "engine"],
    ),
    ("lockDoors", "door"): ("enum_json_list", ["driver", "passenger", "rear_left", "rear_right"]),
    ("setHeadlights", "mode"): ("enum_json_list", ["on", "off", "auto"]),
    ("startEngine", "ignitionMode"): ("enum_json_list", ["START", "STOP"]),
    ("compute_exchange_rate", "base_currency"): (
        "enum_bare_list",
        ["USD", "RMB", "EUR", "JPY", "GBP", "CAD", "AUD", "INR", "RUB", "BRL", "MXN"],
    ),
    ("compute_exchange_rate", "target_currency"): (
        "enum_bare_list",
        ["USD", "RMB", "EUR", "JPY", "GBP", "CAD", "AUD", "INR", "RUB", "BRL", "MXN"],
    ),
    ("get_nearest_airport_by_city", "location"): (
        "enum_bare_list",
        [
            "Rivermist",
            "Stonebrook",
            "Maplecrest",
            "Silverpine",
            "Shadowridge",
            "London",
            "Paris",
            "Sunset Valley",
            "Oakendale",
            "Willowbend",
            "Crescent Hollow",
            "Autumnville",
            "Pinehaven",
            "Greenfield",
            "San Francisco",
            "Los Angeles",
            "New York",
            "Chicago",
            "Boston",
            "Beijing",
            "Hong Kong",
            "Rome",
            "Tokyo",
        ],
    ),
    ("authenticate_travel", "grant_type"): ("options_lead_in", ["read_write", "read", "write"]),
    ("get_flight_cost", "travel_class"): ("options_lead_in", ["economy", "business", "first"]),
    ("wc", "mode"): ("quoted_code_map", ["l", "w", "c"]),
    ("place_order", "order_type"): ("slash_choice", ["Buy", "Sell"]),
}


@pytest.mark.parametrize(("key", "expected"), list(REAL_ENUMS.items()), ids=lambda v: str(v))
def test_extract_enum_on_real_descriptions(key: tuple[str, str], expected: tuple[str, list[str]]) -> None:
    tool, param = key
    spec = _docs_by_name()[tool]["parameters"]["properties"][param]
    assert extract_enum(spec["description"]) == expected


def test_enum_detection_covers_exactly_the_real_enum_parameters() -> None:
    found = {}
    total = 0
    for doc in _docs_by_name().values():
        for param, spec in doc["parameters"]["properties"].items():
            total += 1
            hit = parameter_enum(spec)
            if hit is not None:
                found[(doc["name"], param)] = (hit[0], hit[1])
    assert total == 185
    assert found == REAL_ENUMS
    # lockDoors.door is an array: its values constrain each item.
    assert parameter_enum(_docs_by_name()["lockDoors"]["parameters"]["properties"]["door"])[2] is True


@pytest.mark.parametrize(
    ("description", "expected"),
    [
        ("Sort order. Possible values: asc, desc.", ("options_lead_in", ["asc", "desc"])),
        ("Region. Allowed values are: 'eu', 'us', or 'apac'.", ("options_lead_in", ["eu", "us", "apac"])),
        ("The unit. One of: kg, lb. Default kg.", ("options_lead_in", ["kg", "lb"])),
        ('Mode. [Enum]: ["a", "b", "a"]', ("enum_json_list", ["a", "b"])),
        ("Level [Enum]: low, high", ("enum_bare_list", ["low", "high"])),
        ('Output ("j" for json, "t" for text).', ("quoted_code_map", ["j", "t"])),
        ("Side of the trade (bid/ask).", ("slash_choice", ["bid", "ask"])),
    ],
)
def test_extract_enum_generic_patterns(description: str, expected: tuple[str, list[str]]) -> None:
    assert extract_enum(description) == expected


@pytest.mark.parametrize(
    "description",
    [
        "",
        "Pick one of the files in the current directory.",
        "The expiration date of the card (MM/YYYY).",
        "The sector to retrieve stocks from (e.g., 'Technology').",
        "Priority of the ticket, from 1 to 5. Defaults to 1.",
        "Options are: economy.",  # a single value is not a choice
        "[Enum]: [not json",
        "If True, returns the size in human-readable format (e.g., KB, MB).",
    ],
)
def test_extract_enum_negatives(description: str) -> None:
    assert extract_enum(description) is None


def test_structured_enum_wins_and_items_enum_is_per_item() -> None:
    assert parameter_enum({"type": "string", "description": "Options are: x, y.", "enum": ["a", "b"]}) == (
        "structured",
        ["a", "b"],
        False,
    )
    assert parameter_enum({"type": "array", "items": {"type": "integer", "enum": [1, 2]}}) == (
        "structured",
        [1, 2],
        True,
    )
    assert parameter_enum({"type": "string", "description": "Free text."}) is None


# --------------------------------------------------------------------------------------------------
# φ_schema: annotate_tools
# --------------------------------------------------------------------------------------------------

ALL_ON = {"required": True, "enum": True, "types": True, "hide_optional": False}


def _props(tools: list[dict[str, Any]], name: str) -> dict[str, Any]:
    return next(t for t in tools if t["name"] == name)["parameters"]["properties"]


def test_annotation_order_required_type_enum() -> None:
    out = annotate_tools(_docs("activateParkingBrake"), ALL_ON)
    desc = _props(out, "activateParkingBrake")["mode"]["description"]
    original = _docs_by_name()["activateParkingBrake"]["parameters"]["properties"]["mode"]["description"]
    assert desc == f'{original.rstrip()} (required) (type: string) {ENUM_MARKER_PREFIX} "engage", "release")'


def test_required_marker_only_on_required_parameters() -> None:
    out = annotate_tools(_all_docs(), {"required": True})
    marked = unmarked = 0
    for doc in out:
        required = set(doc["parameters"].get("required", []))
        for name, spec in doc["parameters"]["properties"].items():
            has = REQUIRED_MARKER in spec["description"]
            assert has == (name in required), (doc["name"], name)
            marked += has
            unmarked += not has
    assert (marked, unmarked) == (163, 22)  # docs/release_behaviour.md §6.1: 163 of 185 parameters are required


def test_type_hint_includes_array_item_type() -> None:
    out = annotate_tools(_docs("mean", "ls"), {"types": True})
    assert _props(out, "mean")["numbers"]["description"].endswith("(type: array of float)")
    assert _props(out, "ls")["a"]["description"].endswith("(type: boolean)")
    assert REQUIRED_MARKER not in _props(out, "mean")["numbers"]["description"]


def test_enum_hint_fires_on_every_text_enum_and_nowhere_else() -> None:
    out = annotate_tools(_all_docs(), {"enum": True})
    hinted = set()
    for doc in out:
        for name, spec in doc["parameters"]["properties"].items():
            if ENUM_MARKER_PREFIX in spec["description"] or ITEM_ENUM_MARKER_PREFIX in spec["description"]:
                hinted.add((doc["name"], name))
    assert hinted == set(REAL_ENUMS)
    door = _props(out, "lockDoors")["door"]["description"]
    assert door.endswith(f'{ITEM_ENUM_MARKER_PREFIX} "driver", "passenger", "rear_left", "rear_right")')
    wc_mode = _props(out, "wc")["mode"]["description"]
    assert wc_mode.endswith(f'{ENUM_MARKER_PREFIX} "l", "w", "c")')


def test_structured_enum_on_synthetic_doc() -> None:
    doc = {
        "name": "set_level",
        "description": "Set a level.",
        "parameters": {
            "type": "dict",
            "properties": {
                "level": {"type": "integer", "description": "The level.", "enum": [1, 2, 3]},
                "tags": {"type": "array", "items": {"type": "string", "enum": ["a", "b"]}},
            },
            "required": ["level"],
        },
    }
    out = annotate_tools([doc], {"enum": True})
    props = out[0]["parameters"]["properties"]
    assert props["level"]["description"] == f"The level. {ENUM_MARKER_PREFIX} 1, 2, 3)"
    assert props["tags"]["description"] == f'{ITEM_ENUM_MARKER_PREFIX} "a", "b")'


def test_hide_optional_removes_only_optional_properties() -> None:
    before = _all_docs()
    out = annotate_tools(before, {"hide_optional": True})
    assert [t["name"] for t in out] == [t["name"] for t in before]
    for orig, new in zip(before, out, strict=True):
        required = orig["parameters"].get("required", [])
        assert set(new["parameters"]["properties"]) == set(required)
        assert new["parameters"].get("required", []) == required
    assert "a" not in _props(out, "ls")
    assert set(_props(out, "echo")) == {"content"}


def test_annotate_tools_does_not_mutate_input_and_returns_fresh_objects() -> None:
    tools = _all_docs()
    snapshot = copy.deepcopy(tools)
    out = annotate_tools(tools, {**ALL_ON, "hide_optional": True})
    assert tools == snapshot
    out[0]["parameters"]["properties"].clear()
    out[0]["name"] = "changed"
    assert tools == snapshot


def test_annotate_tools_is_idempotent_and_identity_when_off() -> None:
    tools = _all_docs()
    once = annotate_tools(tools, ALL_ON)
    assert annotate_tools(once, ALL_ON) == once
    assert annotate_tools(tools, None) == tools
    assert annotate_tools(tools, SchemaSwitches()) == tools
    assert once != tools


def test_annotation_reveals_nothing_beyond_the_given_docs() -> None:
    """Every annotation extends the original description, and every enum value shown was already
    written in that description (no value, parameter or tool comes from anywhere else)."""
    tools = _all_docs()
    out = annotate_tools(tools, ALL_ON)
    assert [t["name"] for t in out] == [t["name"] for t in tools]
    for orig, new in zip(tools, out, strict=True):
        assert set(new["parameters"]["properties"]) == set(orig["parameters"]["properties"])
        for name, spec in new["parameters"]["properties"].items():
            original = orig["parameters"]["properties"][name]["description"]
            assert spec["description"].startswith(original.rstrip())
            found = parameter_enum(orig["parameters"]["properties"][name])
            for value in found[1] if found else []:
                assert str(value) in original


def test_annotation_of_miss_func_task_never_mentions_held_out_tools() -> None:
    from bfcl_eval.constants.executable_backend_config import CLASS_FILE_PATH_MAPPING

    entry = next(iter(_entries("multi_turn_miss_func").values()))
    held_out = {name for names in entry["missed_function"].values() for name in names}
    assert held_out
    visible = []
    for cls in entry["involved_classes"]:
        stem = CLASS_FILE_PATH_MAPPING[cls].rsplit(".", 1)[1]
        visible += [d for d in _json_lines(BFCL_DIR / "data" / "multi_turn_func_doc" / f"{stem}.json")]
    visible = [d for d in visible if d["name"] not in held_out]
    out = annotate_tools(visible, {**ALL_ON, "hide_optional": True})
    rendered = json.dumps(out)
    for name in held_out:
        assert f'"name": "{name}"' not in rendered
    assert {t["name"] for t in out} == {t["name"] for t in visible}


def test_annotate_tools_accepts_openai_wrapped_docs() -> None:
    wrapped = [{"type": "function", "function": _docs("cd")[0]}]
    out = annotate_tools(wrapped, {"required": True})
    assert out[0]["function"]["parameters"]["properties"]["folder"]["description"].endswith(REQUIRED_MARKER)


def test_annotate_tools_bad_input() -> None:
    with pytest.raises(TypeError, match="list of tool docs"):
        annotate_tools({"name": "cd"}, ALL_ON)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"tools\[0\]"):
        annotate_tools(["cd"], ALL_ON)  # type: ignore[list-item]
    with pytest.raises(TypeError, match="name"):
        annotate_tools([{"description": "no name"}], ALL_ON)
    with pytest.raises(InterfaceError):
        annotate_tools(_docs("cd"), {"required": "yes"})


def test_schema_instruction() -> None:
    assert schema_instruction(None) is None
    assert schema_instruction({}) is None
    line = schema_instruction(ALL_ON)
    assert line is not None and "\n" not in line
    assert REQUIRED_MARKER in line and "(type:" in line and "accepted values" in line
    only_required = schema_instruction({"required": True})
    assert only_required is not None and "(type:" not in only_required and "accepted values" not in only_required
    assert schema_instruction({"hide_optional": True}) is not None
    # Our own words, not the release's instruction line (docs/release_behaviour.md §2.2).
    assert "Observation note" not in line


# --------------------------------------------------------------------------------------------------
# φ_err: tool errors produced by real BFCL classes
# --------------------------------------------------------------------------------------------------

# (class, task id, method, kwargs, expected family). function name = method.
REAL_TOOL_ERRORS: list[tuple[str, str, str, dict[str, Any], str]] = [
    ("GorillaFileSystem", FILES, "cd", {}, "missing_argument"),
    ("GorillaFileSystem", FILES, "cd", {"path": "workspace"}, "unexpected_argument"),
    ("MessageAPI", MESSAGE_LOGGED_IN, "send_message", {"receiver_id": "USR002"}, "missing_argument"),
    ("GorillaFileSystem", FILES, "cd", {"folder": "no_such_dir"}, "missing_path"),
    ("GorillaFileSystem", FILES, "cat", {"file_name": "missing.txt"}, "missing_path"),
    ("GorillaFileSystem", FILES, "find", {"path": "no_such_dir"}, "missing_path"),
    ("GorillaFileSystem", FILES, "cd", {"folder": "workspace/document"}, "path_not_allowed"),
    ("GorillaFileSystem", FILES, "mv", {"source": "document", "destination": "a/b"}, "path_not_allowed"),
    ("GorillaFileSystem", FILES, "mkdir", {"dir_name": "a/b"}, "invalid_name"),
    ("GorillaFileSystem", FILES, "wc", {"file_name": "x", "mode": "q"}, "invalid_value"),
    ("GorillaFileSystem", FILES, "cd", {"folder": 5}, "wrong_type"),
    ("MathAPI", MATH, "add", {"a": "1", "b": 2}, "wrong_type"),
    ("MathAPI", MATH, "mean", {"numbers": []}, "invalid_value"),
    ("MathAPI", MATH, "divide", {"a": 1, "b": 0}, "invalid_value"),
    ("MathAPI", MATH, "logarithm", {"value": "x", "base": 2, "precision": 3}, "wrong_type"),
    ("TwitterAPI", TWITTER_LOGGED_OUT, "post_tweet", {"content": "hello"}, "auth_required"),
    ("TwitterAPI", TWITTER_LOGGED_OUT, "get_tweet", {"tweet_id": 999}, "unknown_identifier"),
    ("TicketAPI", TICKET_LOGGED_OUT, "create_ticket", {"title": "t"}, "auth_required"),
    ("TicketAPI", TICKET_LOGGED_OUT, "get_user_tickets", {}, "auth_required"),
    ("TicketAPI", TICKET_LOGGED_IN, "create_ticket", {"title": "t", "priority": 9}, "invalid_value"),
    ("TicketAPI", TICKET_LOGGED_IN, "create_ticket", {"title": "t", "priority": "3"}, "wrong_type"),
    ("TicketAPI", TICKET_LOGGED_IN, "close_ticket", {"ticket_id": 9999}, "unknown_identifier"),
    ("MessageAPI", MESSAGE_LOGGED_OUT, "send_message", {"receiver_id": "USR002", "message": "m"}, "auth_required"),
    ("MessageAPI", MESSAGE_LOGGED_IN, "send_message", {"receiver_id": "nobody", "message": "m"}, "unknown_identifier"),
    ("MessageAPI", MESSAGE_LOGGED_IN, "add_contact", {"user_name": "Alice"}, "already_done"),
    ("TradingBot", TRADING_LOGGED_OUT, "place_order",
     {"order_type": "Buy", "symbol": "AAPL", "price": 1.0, "amount": 1}, "auth_required"),
    ("TradingBot", TRADING_LOGGED_OUT, "get_order_history", {}, "auth_required"),
    ("TradingBot", TRADING_LOGGED_IN, "get_stock_info", {"symbol": "ZZZZ"}, "unknown_identifier"),
    ("TradingBot", TRADING_LOGGED_IN, "place_order",
     {"order_type": "Buy", "symbol": "AAPL", "price": -1.0, "amount": 1}, "invalid_value"),
    ("TradingBot", TRADING_LOGGED_IN, "place_order",
     {"order_type": "Buy", "symbol": "AAPL", "price": 1e9, "amount": 100}, "precondition"),
    ("TradingBot", TRADING_LOGGED_IN, "withdraw_funds", {"amount": 10.0}, "precondition"),
    ("TradingBot", TRADING_LOGGED_IN, "notify_price_change", {"stocks": ["AAPL"], "threshold": "5"}, "wrong_type"),
    ("TravelAPI", TRAVEL, "get_credit_card_balance", {"access_token": "made_up", "card_id": "1"}, "invalid_token"),
    ("TravelAPI", TRAVEL, "get_credit_card_balance",
     {"access_token": "abc123token", "card_id": "nocard"}, "unknown_identifier"),
    ("TravelAPI", TRAVEL, "book_flight",
     {"access_token": "abc123token", "card_id": "1234-5678-9012-3456", "travel_date": "2024/01/01",
      "travel_from": "SFO", "travel_to": "LAX", "travel_class": "economy"}, "invalid_value"),
    ("TravelAPI", TRAVEL, "get_flight_cost",
     {"travel_from": "SFO", "travel_to": "LAX", "travel_date": "2024-01-01", "travel_class": "coach"},
     "invalid_value"),
    ("TravelAPI", TRAVEL, "cancel_booking", {"access_token": "abc123token", "booking_id": "none"},
     "unknown_identifier"),
    ("TravelAPI", TRAVEL, "set_budget_limit", {"access_token": "abc123token", "budget_limit": "x"}, "wrong_type"),
    ("VehicleControlAPI", VEHICLE, "startEngine", {"ignitionMode": "START"}, "precondition"),
    ("VehicleControlAPI", VEHICLE, "setHeadlights", {"mode": "dim"}, "invalid_value"),
    ("VehicleControlAPI", VEHICLE, "pressBrakePedal", {"pedalPosition": 2}, "invalid_value"),
    ("VehicleControlAPI", VEHICLE, "setCruiseControl",
     {"speed": 50, "activate": True, "distanceToNextVehicle": 100}, "precondition"),
    ("VehicleControlAPI", VEHICLE, "set_navigation", {"destination": 5}, "wrong_type"),
    ("VehicleControlAPI", VEHICLE, "lockDoors", {"unlock": False, "door": ["trunk"]}, "unknown_identifier"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("cls", "task", "method", "kwargs", "family"),
    REAL_TOOL_ERRORS,
    ids=[f"{c[2]}-{c[4]}-{i}" for i, c in enumerate(REAL_TOOL_ERRORS)],
)
def test_error_feedback_on_real_bfcl_errors(
    cls: str, task: str, method: str, kwargs: dict[str, Any], family: str
) -> None:
    text = _result_text(_instance(cls, task), method, **kwargs)
    error = tool_error_message(text)
    assert error is not None, text
    assert classify_tool_error(error) == family, error
    hint = error_feedback("tool_error", text, function_name=method)
    assert hint is not None and hint.startswith(itf.HINT_PREFIX)
    assert f"`{method}`" in hint
    assert "\n" not in hint
    if family == "missing_argument":
        assert "'folder'" in hint or "'message'" in hint
    if family == "unexpected_argument":
        assert "'path'" in hint


def test_tool_hint_falls_back_to_method_named_in_typeerror() -> None:
    text = _result_text(_instance("GorillaFileSystem", FILES), "cd")
    hint = error_feedback("tool_error", text)
    assert hint is not None and "`cd`" in hint and "'folder'" in hint


def test_tool_hint_names_the_function_not_the_call_id() -> None:
    text = _result_text(_instance("GorillaFileSystem", FILES), "cd", folder="no_such_dir")
    hint = error_feedback("tool_error", text, function_name="cd")
    assert hint is not None and "`cd`" in hint and "cd_1" not in hint


def test_hints_do_not_repeat_values_from_the_error() -> None:
    """A hint names the function (and, for argument errors, parameter names) but never repeats
    values the tool listed, such as the registered card ids or the valid travel classes."""
    travel = _instance("TravelAPI", TRAVEL)
    card = _result_text(travel, "get_credit_card_balance", access_token="abc123token", card_id="nocard")
    assert "1234-5678-9012-3456" in card
    hint = error_feedback("tool_error", card, function_name="get_credit_card_balance")
    assert hint is not None and "1234-5678-9012-3456" not in hint and "nocard" not in hint
    cls_err = _result_text(
        travel, "get_flight_cost", travel_from="SFO", travel_to="LAX", travel_date="2024-01-01",
        travel_class="coach",
    )  # fmt: skip
    hint = error_feedback("tool_error", cls_err, function_name="get_flight_cost")
    assert hint is not None and "economy" not in hint and "coach" not in hint


def test_authentication_errors_of_every_class_with_a_login() -> None:
    cases = [
        (_instance("TwitterAPI", TWITTER_LOGGED_OUT), "follow_user", {"username_to_follow": "a"}),
        (_instance("MessageAPI", MESSAGE_LOGGED_OUT), "view_messages_sent", {}),
        (_instance("TicketAPI", TICKET_LOGGED_OUT), "create_ticket", {"title": "t"}),
        (_instance("TradingBot", TRADING_LOGGED_OUT), "get_account_info", {}),
    ]
    for obj, method, kwargs in cases:
        text = _result_text(obj, method, **kwargs)
        assert classify_tool_error(tool_error_message(text) or "") == "auth_required", text
    # TravelAPI authenticates with tokens; no real task starts without one, so the
    # "not initialized" text needs a scenario without a token.
    travel = _instance("TravelAPI", TRAVEL, config_override={})
    text = _result_text(travel, "register_credit_card", access_token="t", card_number="1",
                        expiration_date="01/2030", cardholder_name="A", card_verification_number=1)  # fmt: skip
    assert tool_error_message(text) == "Token not initialized"
    assert classify_tool_error("Token not initialized") == "invalid_token"


def test_tool_error_message_on_successes_and_odd_results() -> None:
    fs = _instance("GorillaFileSystem", FILES)
    assert tool_error_message(_result_text(fs, "ls")) is None
    assert tool_error_message(_result_text(fs, "pwd")) is None
    twitter = _instance("TwitterAPI", TWITTER_LOGGED_OUT)
    # A failed login is a status flag, not an error (as in BFCL).
    failed_login = _result_text(twitter, "authenticate_twitter", username="x", password="y")
    assert json.loads(failed_login) == {"authentication_status": False}
    assert tool_error_message(failed_login) is None
    assert error_feedback("tool_error", failed_login, function_name="authenticate_twitter") is None
    vehicle = _instance("VehicleControlAPI", VEHICLE)
    weather = _result_text(vehicle, "get_outside_temperature_from_weather_com")
    assert tool_error_message(weather) == "404"
    assert classify_tool_error("404") == "generic"
    assert tool_error_message({"error": "x"}) == "x"
    assert tool_error_message([{"ok": 1}, {"error": "y"}]) == "y"
    assert tool_error_message("plain text result") is None
    assert tool_error_message("{not json, not a literal") is None


def _bfcl_error_literals() -> list[tuple[str, str]]:
    """Every error text literal in the eight classes' source: values of "error" keys, assignments
    to ["error"], and raised exception messages. f-string holes and concatenations become 'x'."""

    def render(node: ast.AST) -> str | None:
        if isinstance(node, ast.Constant):
            return node.value if isinstance(node.value, str) else None
        if isinstance(node, ast.JoinedStr):
            return "".join(v.value if isinstance(v, ast.Constant) else "x" for v in node.values)
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
            left = render(node.left)
            return None if left is None else left + "x"
        return None

    src = BFCL_DIR / "eval_checker" / "multi_turn_eval" / "func_source_code"
    out: list[tuple[str, str]] = []
    for stem in MULTI_TURN_DOC_FILES:
        for node in ast.walk(ast.parse((src / f"{stem}.py").read_text())):
            values: list[ast.AST] = []
            if isinstance(node, ast.Dict):
                values += [v for k, v in zip(node.keys, node.values, strict=True)
                           if isinstance(k, ast.Constant) and k.value == "error"]  # fmt: skip
            elif isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Subscript):
                key = node.targets[0].slice
                if isinstance(key, ast.Constant) and key.value == "error":
                    values.append(node.value)
            elif isinstance(node, ast.Raise) and isinstance(node.exc, ast.Call) and node.exc.args:
                values.append(node.exc.args[0])
            out += [(stem, text) for v in values if (text := render(v)) is not None]
    return out


def test_every_bfcl_error_literal_falls_in_a_specific_family() -> None:
    literals = _bfcl_error_literals()
    assert len(literals) > 100
    generic = sorted({text for _, text in literals if classify_tool_error(text) == "generic"})
    # The one literal we leave generic: an internal formatting failure, no recovery advice fits.
    assert generic == ["KeyError during formatting: x"]
    families = {classify_tool_error(text) for _, text in literals}
    # Argument-name errors only arise as Python TypeErrors, never as literals in the classes.
    assert families == set(TOOL_ERROR_FAMILIES) - {"missing_argument", "unexpected_argument"}


# --------------------------------------------------------------------------------------------------
# φ_err: parse errors and unavailable tools
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("message", "cause"),
    [
        ("Invalid tool call JSON: Expecting ',' delimiter: line 1 column 30 (char 29)", "not valid JSON"),
        ("Tool call JSON must contain both 'name' and 'arguments'.", '"name" and "arguments"'),
        ("Tool 'cd' has non-JSON string arguments.", "has to be a JSON object"),
        ("Tool 'cd' arguments must be a JSON object.", "has to be a JSON object"),
        (
            "Found tool_call tag text, but no valid <tool_call>{...}</tool_call> block.",
            "closing </tool_call>",
        ),
    ],
)
def test_parse_error_hints(message: str, cause: str) -> None:
    hint = error_feedback("parse_error", message)
    assert hint is not None
    lines = hint.split("\n")
    assert len(lines) == 2 and all(line.startswith(itf.HINT_PREFIX) for line in lines)
    assert cause in lines[0]
    assert "<tool_call>" in lines[1] and "<tool name>" in lines[1]


@pytest.mark.parametrize(
    ("text", "cause"),
    [
        ("<tool_call>{bad}</tool_call>", "not valid JSON"),
        ('<tool_call>{"name": "cd", "arguments": {"folder": NaN}}</tool_call>', "not valid JSON"),
        ("<tool_call>[1]</tool_call>", '"name" and "arguments"'),
        ('<tool_call>{"name": "cd"}</tool_call>', '"name" and "arguments"'),
        ('<tool_call>{"name": "", "arguments": {}}</tool_call>', '"name" must be'),
        (
            '<tool_call>{"name": "a_tool_with_a_rather_long_name", "arguments": [1]}</tool_call>',
            "JSON object",
        ),
        ('<tool_call>{"name": "cd", "arguments": "not json"}</tool_call>', "JSON object"),
        ('<tool_call>{"name": "cd", "arguments": {}}', "closing </tool_call>"),
    ],
)
def test_parse_error_hints_on_the_service_parser(text: str, cause: str) -> None:
    """The service's own parser messages each get a cause-specific line."""
    from env_service.parser import parse_tool_calls

    error = parse_tool_calls(text).error
    assert error
    hint = error_feedback("parse_error", error)
    assert hint is not None
    first, second = hint.split("\n")
    assert cause in first
    assert "<tool name>" in second


def test_invalid_argument_name_hint() -> None:
    hint = error_feedback("parse_error", "argument name 'x y' of 'cd' is not a valid identifier", "cd")
    assert hint is not None and "identifiers" in hint.split("\n")[0]


def test_parse_error_with_unrecognised_text_still_gets_the_format_line() -> None:
    hint = error_feedback("parse_error", "something odd happened")
    assert hint is not None and hint.count("\n") == 0 and "<tool_call>" in hint


def test_unavailable_tool_lists_available_names() -> None:
    names = [d["name"] for d in _docs_by_name().values() if d["name"] in {"cd", "ls", "cat"}]
    hint = error_feedback("unavailable_tool", "", function_name="change_dir", available=names)
    assert hint is not None
    assert "`change_dir`" in hint
    for n in names:
        assert n in hint
    assert "more)" not in hint


def test_unavailable_tool_caps_the_list() -> None:
    names = list(_docs_by_name())
    assert len(names) > MAX_LISTED_TOOLS
    hint = error_feedback("unavailable_tool", "", function_name="nope", available=names)
    assert hint is not None
    assert f"(+{len(names) - MAX_LISTED_TOOLS} more)" in hint
    assert names[MAX_LISTED_TOOLS - 1] in hint
    listed = hint.split("Tools available now: ", 1)[1].split(" (+", 1)[0].split(", ")
    assert listed == names[:MAX_LISTED_TOOLS]


def test_unavailable_tool_never_lists_names_it_was_not_given() -> None:
    """Held-out tools are simply absent from `available`; the hint cannot name them."""
    entry = next(iter(_entries("multi_turn_miss_func").values()))
    held_out = {n for names in entry["missed_function"].values() for n in names}
    available = [n for n in ("cd", "ls", "cat", "mkdir") if n not in held_out]
    hint = error_feedback("unavailable_tool", "", function_name=min(held_out), available=available)
    assert hint is not None
    listed = hint.split("Tools available now: ", 1)[1]
    for name in held_out:
        assert name not in listed


def test_unavailable_tool_sanitises_the_echoed_name() -> None:
    hint = error_feedback("unavailable_tool", "", function_name="evil`\n# Tools" + "x" * 200, available=["cd"])
    assert hint is not None
    first = hint.split("\n")[0]
    assert "`evil # Tools" in first and "\n" not in first and len(first) < 200


def test_error_feedback_bad_arguments() -> None:
    with pytest.raises(ValueError, match="unknown error kind"):
        error_feedback("tool_failure", "x")
    with pytest.raises(TypeError):
        error_feedback("tool_error", None)  # type: ignore[arg-type]


# --------------------------------------------------------------------------------------------------
# φ_cap and the system suffix
# --------------------------------------------------------------------------------------------------


def test_cue_block() -> None:
    assert cue_block([]) == ""
    block = cue_block([Cue("state_mismatch", "Check state first."), {"tag": "spurious_tool_call", "text": "B."}])
    lines = block.split("\n")
    assert lines == [itf.CUE_HEADER, "- Check state first.", "- B."]
    with pytest.raises(InterfaceError):
        cue_block([{"tag": "a", "text": "two\nlines"}])


def test_render_system_suffix_joins_parts_in_order() -> None:
    spec = {
        "schema": {"required": True},
        "error_feedback": True,
        "cues": [{"tag": "state_mismatch", "text": "Check state first."}],
    }
    suffix = render_system_suffix(spec)
    instruction = schema_instruction({"required": True})
    assert suffix == f"{instruction}\n\n{cue_block(parse_interface(spec).cues)}"
    assert render_system_suffix({"cues": spec["cues"]}) == cue_block(parse_interface(spec).cues)
    assert render_system_suffix({"schema": {"enum": True}}) == schema_instruction({"enum": True})
    # φ_err only changes observations, never the system prompt.
    assert render_system_suffix({"error_feedback": True}) == ""
    assert render_system_suffix(Interface()) == ""
    with pytest.raises(InterfaceError):
        render_system_suffix({"cues": 5})


# --- the release's φ_schema wording (schema.release_wording) and raw revealed docs (schema.skip_revealed) -----
def test_release_wording_markers_and_instruction() -> None:
    tool = {"name": "f", "parameters": {"type": "dict", "required": ["a", "b"], "properties": {
        "a": {"type": "string", "description": "Mode. [Enum]: [\"x\", \"y\"] "},  # trailing space kept, as released
        "b": {"type": "integer", "description": "Count.", "enum": [1, 2]},
        "c": {"type": "array", "description": ""},
    }}}
    switches = {"required": True, "enum": True, "types": True, "release_wording": True}
    props = annotate_tools([tool], switches)[0]["parameters"]["properties"]
    # enums written in the description text are not read (only structured lists), markers in the release's order
    assert props["a"]["description"] == 'Mode. [Enum]: ["x", "y"]  [required] [type: string]'
    assert props["b"]["description"] == "Count. [required] [type: integer] Allowed values: 1, 2"
    assert props["c"]["description"] == "[type: array]"
    assert annotate_tools(annotate_tools([tool], switches), switches) == annotate_tools([tool], switches)
    assert schema_instruction(switches).startswith("Observation note: parameters marked [required]")
    assert schema_instruction({"release_wording": True}) is None  # a modifier alone changes nothing
    assert parse_interface({"schema": {"release_wording": True, "skip_revealed": True}}).is_raw


@pytest.mark.parametrize("skip", [False, True])
def test_revealed_docs_annotated_unless_skipped(skip: bool) -> None:
    from env_service.config import EpisodeConfig
    from env_service.episode import Episode
    from env_service.tasks import load_tasks

    omega = parse_interface({"schema": {"required": True, "skip_revealed": skip}})
    episode = Episode("r", load_tasks()["multi_turn_miss_func_0"], "train", omega, EpisodeConfig())
    observation = [episode.step("ok")["observation"]["content"] for _ in range(3)][-1]  # the reveal of turn 3
    assert ("(required)" in observation) is (not skip)
    assert "(required)" in episode.initial_messages()[0]["content"]

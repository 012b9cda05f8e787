"""Capability state and failure profile: hand-computed statistics, dynamic weights over five windows,
explicit zeros, persistence tied to the run."""

from __future__ import annotations

import json

import pytest

from seal.core.capability import (
    CapabilityState,
    DynamicWeightConfig,
    RunMismatchError,
    dominant_tag,
    turn_positions,
)
from seal.core.profile import failure_profile
from seal.core.record import EpisodeRecord
from seal.recipe import ConfigError, load_config

EMPTY, PASS, STATE = "empty_turn_model_response", "pass", "state_mismatch"
SPUR, INST, RESP, CHECK = "spurious_tool_call", "instance_mismatch", "response_mismatch", "checker_error"


def rec(task, tags, reward, success=None):
    """An episode record whose tags are `tags` in either vocabulary (each state reads its own field)."""
    success = reward >= 1 if success is None else success
    return EpisodeRecord(task_id=task, failure_tags=tuple(tags), paper_labels=tuple(tags), reward=reward,
                         accuracy=1.0 if success else 0.0)


def records(n, tags, reward, success=None, task="multi_turn_base_0"):
    return [rec(task, tags, reward, success) for _ in range(n)]


# ------------------------------------------------------------------ statistics
@pytest.mark.parametrize(
    ("n", "expected"),
    [
        (1, ("only",)),
        (2, ("middle", "late")),  # 1/2 <= 2/3, 2/2 > 2/3
        (3, ("early", "middle", "late")),
        (4, ("early", "middle", "late", "late")),  # 1/4, 2/4, 3/4, 4/4
        (6, ("early", "early", "middle", "middle", "late", "late")),  # 2/6 = 1/3 and 4/6 = 2/3 inclusive
    ],
)
def test_turn_positions(n, expected):
    assert turn_positions(n) == expected


def test_dominant_tag():
    assert dominant_tag([PASS, STATE, PASS]) == STATE
    assert dominant_tag([SPUR, EMPTY, EMPTY, CHECK]) == EMPTY
    assert dominant_tag([SPUR, EMPTY]) == SPUR  # tie: first seen
    assert dominant_tag([PASS, PASS]) == PASS
    assert dominant_tag([]) == "unknown"


def _observed_state():
    state = CapabilityState(run_id="run-a")
    state.observe(
        [
            rec("multi_turn_base_1", (STATE, PASS, PASS), 0.0, False),
            rec("multi_turn_miss_func_2", (), 1.0, True),
            rec("multi_turn_base_1", (PASS,), 1.0, True),
            EpisodeRecord("multi_turn_base_3", failure_tags=(SPUR, EMPTY, EMPTY, CHECK), reward=0.5),  # ungraded
        ],
        step=7,
    )
    return state


def test_observe_turn_weighted_statistics_by_hand():
    state = _observed_state()
    for window in (True, False):
        tags = {k: (s.count, s.success, s.reward_sum, s.partial_count) for k, s in state.bucket("tags", window).items()}
        assert tags == {
            STATE: (1, 0, 0.0, 0),
            PASS: (3, 1, 1.0, 0),  # two turns of a failed trajectory + one of a success
            "unknown": (1, 1, 1.0, 0),  # the trajectory without tags
            SPUR: (1, 0, 0.5, 1),
            EMPTY: (2, 0, 1.0, 2),
            CHECK: (1, 0, 0.5, 1),
        }
        cats = {k: (s.count, s.success, s.reward_sum, s.partial_count)
                for k, s in state.bucket("categories", window).items()}
        assert cats == {"multi_turn_base": (3, 1, 1.5, 1), "multi_turn_miss_func": (1, 1, 1.0, 0)}
    cat_tags = {k: s.count for k, s in state.bucket("category_tags", True).items()}
    assert cat_tags == {"multi_turn_base::state_mismatch": 1, "multi_turn_base::pass": 3,
                        "multi_turn_miss_func::unknown": 1, "multi_turn_base::spurious_tool_call": 1,
                        "multi_turn_base::empty_turn_model_response": 2, "multi_turn_base::checker_error": 1}
    positions = {k: s.count for k, s in state.bucket("position_tags", True).items()}
    assert positions == {"early::state_mismatch": 1, "middle::pass": 1, "late::pass": 1, "only::unknown": 1,
                         "only::pass": 1, "early::spurious_tool_call": 1,
                         "middle::empty_turn_model_response": 1, "late::empty_turn_model_response": 1,
                         "late::checker_error": 1}
    task = state.bucket("tasks", True)["multi_turn_base_1"]
    assert (task.count, task.success, task.reward_sum) == (2, 1, 1.0)
    info = state.task_info("multi_turn_base_1")
    assert info["last_tag"] == PASS and info["dominant_tags"] == {STATE: 1, PASS: 1} and info["last_step"] == 7
    assert state.task_info("multi_turn_base_3")["last_tag"] == EMPTY
    assert state.observe_count == 4 and state.last_step == 7

    state.reset_window()
    assert state.bucket("tags", True) == {} and state.bucket("tags", False)[PASS].count == 3


def test_failure_profile_by_hand():
    profile = failure_profile(_observed_state())
    assert profile.source == "window"
    assert profile.total_count == 8 and profile.excluded_count == 1  # 9 occurrences, one checker_error
    empty = profile.tags[EMPTY]
    assert empty.prevalence == pytest.approx(2 / 8) and empty.reward_mean == pytest.approx(0.5)
    assert empty.pressure == pytest.approx(0.25 * 0.5)
    assert CHECK not in profile.tags
    assert profile.tags[PASS].reward_mean == pytest.approx(1 / 3)
    base = profile.categories["multi_turn_base"]
    assert base.trajectories == 3 and base.success_rate == pytest.approx(1 / 3)
    assert base.total_count == 7 and base.tags[EMPTY].prevalence == pytest.approx(2 / 7)
    assert json.loads(json.dumps(profile.to_dict()))["tags"][EMPTY]["count"] == 2


def test_records_and_bad_records():
    r = EpisodeRecord("multi_turn_long_context_4", failure_tags=[PASS, PASS], paper_labels=["pass"], accuracy=1.0)
    assert r.category == "multi_turn_long_context" and r.success and r.tags("paper") == ("pass",)
    assert EpisodeRecord.from_dict(r.to_dict() | {"messages": []}) == r  # the wire form round-trips
    state = CapabilityState()
    with pytest.raises(TypeError, match="EpisodeRecord"):  # the core takes the typed record only
        state.observe([{"task_id": "multi_turn_base_1", "tags": [], "reward": 0.0}])
    with pytest.raises(TypeError):
        EpisodeRecord("multi_turn_base_1", failure_tags="pass")
    with pytest.raises(ValueError):
        EpisodeRecord("multi_turn_base_1", reward=float("nan"))
    with pytest.raises(KeyError):
        EpisodeRecord.from_dict({"failure_tags": []})


# ------------------------------------------------------------------ dynamic weights
def test_dynamic_weights_over_five_windows_by_hand():
    state = CapabilityState(run_id="r")
    base = dict(state.base_weights)

    # Window 1: 8 failed trajectories [empty, empty, pass, pass]: empty 16 of 32 occurrences.
    # empty: target = 1.5 (1 + 1 * 0.5 * (1 - 0) * min(1, 16/32)) = 1.875; w = .75*1.5 + .25*1.875
    state.observe(records(8, [EMPTY, EMPTY, PASS, PASS], 0.0))
    w = state.update_dynamic_weights()
    assert w[EMPTY] == pytest.approx(1.59375)
    for tag in (SPUR, "correct_abstention", STATE, RESP, INST, PASS):
        assert w[tag] == pytest.approx(base[tag])  # absent tags: target = base = previous
    assert w[CHECK] == 1.0 and w["gt_error"] == 1.0
    state.reset_window()

    # Window 2: the same 8 failures plus 8 successes [pass]*4: empty 16 of 64 -> prevalence 0.25.
    # target = 1.5 (1 + 0.25 * 0.5) = 1.6875; w = .75*1.59375 + .25*1.6875
    state.observe(records(8, [EMPTY, EMPTY, PASS, PASS], 0.0) + records(8, [PASS] * 4, 1.0))
    w = state.update_dynamic_weights()
    assert w[EMPTY] == pytest.approx(1.6171875)
    assert w[PASS] == 1.0
    state.reset_window()

    # Window 3: 16 failures [state x3, checker_error]: state 48 of 48 (checker_error excluded).
    # state: target = clamp(1.0 (1 + 1 * 1 * 1), .5, 2) = 2.0; w = .75*1 + .25*2 = 1.25
    # empty (absent): w = .75*1.6171875 + .25*1.5
    state.observe(records(16, [STATE, STATE, STATE, CHECK], 0.0))
    w = state.update_dynamic_weights()
    assert w[STATE] == pytest.approx(1.25)
    assert w[EMPTY] == pytest.approx(1.587890625)
    assert w[CHECK] == 1.0
    state.reset_window()

    # Window 4: 4 partial trajectories (reward 0.5) [resp, resp, pass, pass]: resp 8 of 16.
    # resp: target = 0.9 (1 + 0.5 * 0.5 * min(1, 8/32)) = 0.95625; w = .75*.9 + .25*.95625
    state.observe(records(4, [RESP, RESP, PASS, PASS], 0.5, success=False))
    w = state.update_dynamic_weights()
    assert w[RESP] == pytest.approx(0.9140625)
    assert w[STATE] == pytest.approx(1.1875)  # .75*1.25 + .25*1
    assert w[EMPTY] == pytest.approx(1.56591796875)  # .75*1.587890625 + .25*1.5
    state.reset_window()

    # Window 5: 8 failures [spur, spur, inst, inst]: each 16 of 32, confidence 0.5.
    # spur: target = clamp(2.0 * 1.25, .5, 2) = 2.0 -> stays 2.0; inst: target = .6 * 1.25 = .75
    state.observe(records(8, [SPUR, SPUR, INST, INST], 0.0))
    w = state.update_dynamic_weights()
    assert w[SPUR] == pytest.approx(2.0)
    assert w[INST] == pytest.approx(0.6375)  # .75*.6 + .25*.75
    assert w[EMPTY] == pytest.approx(1.5494384765625)
    assert w[STATE] == pytest.approx(1.140625)
    assert w[RESP] == pytest.approx(0.910546875)
    assert w["correct_abstention"] == pytest.approx(1.8) and w[PASS] == 1.0
    state.reset_window()

    # Empty window: the profile falls back to the run totals (192 non-excluded occurrences:
    # empty 32, pass 72, state 48, resp 8, spur 16, inst 16).
    # empty: target = 1.5 (1 + 32/192) = 1.75; state: target = 1.0 (1 + 48/192) = 1.25
    assert failure_profile(state).source == "total"
    w = state.update_dynamic_weights()
    assert w[EMPTY] == pytest.approx(0.75 * 1.5494384765625 + 0.25 * 1.75)
    assert w[STATE] == pytest.approx(0.75 * 1.140625 + 0.25 * 1.25)


def test_explicit_zeros_stay_zeros():
    failing = records(40, [EMPTY, EMPTY], 0.0)

    frozen = CapabilityState(config=DynamicWeightConfig(ema_beta=0))
    frozen.observe(failing)
    assert frozen.update_dynamic_weights()[EMPTY] == 1.5  # beta = 0: never moves

    flat = CapabilityState(config=DynamicWeightConfig(prevalence_alpha=0.0))
    flat.observe(failing)
    assert flat.update_dynamic_weights()[EMPTY] == 1.5  # alpha = 0: target = base

    eager = CapabilityState(config=DynamicWeightConfig(confidence_samples=0))
    eager.observe(records(1, [EMPTY, PASS], 0.0))  # 1 occurrence, full confidence at once
    # target = clamp(1.5 (1 + 0.5), .5, 2) = 2.0; w = .75*1.5 + .25*2
    assert eager.update_dynamic_weights()[EMPTY] == pytest.approx(1.625)

    release = CapabilityState(config=DynamicWeightConfig(ema_beta=0, release_zero_fallback=True))
    assert release.config.ema_beta == 0.25  # the release's `value or default`
    release.observe(failing)
    assert release.update_dynamic_weights()[EMPTY] > 1.5

    static = CapabilityState(config=DynamicWeightConfig(enable=False))
    static.observe(failing)
    assert static.update_dynamic_weights() == static.base_weights


@pytest.mark.parametrize("overrides,message", [
    (["seal.capability.beta=0.1"], "seal.capability.beta: unknown key"),
    (["seal.capability.ema_beta=1.5"], r"seal.capability.ema_beta: must lie in \[0, 1\]"),
    (["seal.capability.min_weight=0.0"], "seal.capability.min_weight: must be > 0"),
    (["seal.capability.prevalence_alpha=-1"], "seal.capability.prevalence_alpha: must be >= 0"),
    (["seal.capability.confidence_samples=.inf"], "seal.capability.confidence_samples: must be a finite number"),
    (["seal.capability.min_weight=1.5", "seal.capability.max_weight=1.2"],
     "seal.capability.min_weight must be <= seal.capability.max_weight"),
])
def test_dynamic_config_validation(overrides, message):
    # The knobs' declared ranges are checked where a run's config is built: the recipe.
    with pytest.raises(ConfigError, match=message):
        load_config(None, overrides)


def test_dynamic_config_checks_its_rule_across_knobs():
    with pytest.raises(ValueError, match="min_weight must be <= max_weight"):
        DynamicWeightConfig(min_weight=1.5, max_weight=1.2)


def test_paper_vocabulary_state_uses_paper_table():
    state = CapabilityState(vocabulary="paper")
    assert state.base_weights["missing_tool_call"] == 1.5
    state.observe(records(8, ["missing_tool_call", "missing_tool_call", "pass", "pass"], 0.0))
    # same arithmetic as window 1 above with base 1.5
    assert state.update_dynamic_weights()["missing_tool_call"] == pytest.approx(1.59375)


# ------------------------------------------------------------------ persistence
def test_save_load_roundtrip_keeps_window_and_weights(tmp_path):
    state = _observed_state()
    state.update_dynamic_weights()
    path = state.save(tmp_path / "ckpt" / "seal_state.json")
    restored = CapabilityState(run_id="run-a")
    restored.load(path)
    assert restored.state_dict() == state.state_dict()
    assert restored.bucket("tags", True)[EMPTY].count == 2  # the window survives (release saved it empty)
    # and it keeps evolving identically
    more = records(8, [STATE, PASS], 0.0)
    state.observe(more)
    restored.observe(more)
    assert restored.update_dynamic_weights() == state.update_dynamic_weights()


def test_load_refuses_another_run_unless_forced(tmp_path):
    path = _observed_state().save(tmp_path / "state.json")
    with pytest.raises(RunMismatchError):
        CapabilityState(run_id="run-b").load(path)
    with pytest.raises(RunMismatchError):
        CapabilityState().load(path)  # no run id: never matched silently
    forced = CapabilityState(run_id="run-b")
    forced.load(path, force=True)
    assert forced.observe_count == 4
    with pytest.raises(ValueError, match="vocabulary"):
        CapabilityState(vocabulary="paper", run_id="run-a").load(path, force=True)


def test_metrics_prefix_and_values():
    state = _observed_state()
    state.update_dynamic_weights()
    metrics = state.metrics()
    assert all(k.startswith("capability/") for k in metrics)
    assert metrics["capability/observe_count"] == 4
    assert metrics["capability/window/multi_turn_base/success_rate"] == pytest.approx(1 / 3)
    assert metrics["capability/window/tag_frac/pass"] == pytest.approx(3 / 9)
    assert metrics["capability/weight/spurious_tool_call"] == pytest.approx(2.0)


def test_a_window_of_harness_errors_only_keeps_the_weights_or_resets_them_as_the_release():
    for reset in (False, True):
        state = CapabilityState("progress", config=DynamicWeightConfig(reset_on_empty=reset))
        state.observe(records(40, [EMPTY, EMPTY], 0.0))
        moved = state.update_dynamic_weights()
        assert moved[EMPTY] > state.base_weights[EMPTY]
        state.reset_window()
        state.observe(records(5, [CHECK], 0.0))  # the window holds only checker_error: no evidence about the policy
        assert state.profile("window").total_count == 0
        after = state.update_dynamic_weights()
        assert after == (state.base_weights if reset else moved)

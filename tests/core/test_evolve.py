"""Interface evolution: cue selection by the release thresholds, hysteresis, φ_err modes, versions,
and cue texts that never name a tool."""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path

import pytest

from env_service.protocol import SCHEMA_KEYS
from env_service.vocab import EXCLUDED_TAGS, PAPER_LABELS, PROGRESS_TAGS, SUCCESS_TAGS
from seal.core.evolve import (
    CUE_TEXTS,
    EvolveConfig,
    evolve,
    initial_interface,
    interface_metrics,
    validate_interface,
)
from seal.core.profile import FailureProfile, TagProfile
from seal.recipe import ConfigError, load_config

EMPTY, STATE, RESP = "empty_turn_model_response", "state_mismatch", "response_mismatch"
SPUR, INST = "spurious_tool_call", "instance_mismatch"


def profile(**tags: tuple[int, float, float]) -> FailureProfile:
    """A profile from tag=(count, prevalence, reward_mean)."""
    return FailureProfile(
        source="window",
        total_count=100,
        excluded_count=0,
        tags={
            tag: TagProfile(count=c, prevalence=p, reward_mean=r, success_rate=0.0, pressure=p * (1 - r))
            for tag, (c, p, r) in tags.items()
        },
    )


def with_cues(*tags: str, error_feedback: bool = False, version: int = 3) -> dict:
    omega = initial_interface(EvolveConfig())
    omega.update(version=version, error_feedback=error_feedback,
                 cues=[{"tag": t, "text": CUE_TEXTS[t]} for t in tags])
    return omega


def cue_tags(omega: dict) -> list[str]:
    return [c["tag"] for c in omega["cues"]]


def test_initial_interface():
    assert initial_interface(EvolveConfig()) == {
        "version": 0,
        "schema": {"required": True, "enum": True, "types": False, "hide_optional": False,
                   "release_wording": False, "skip_revealed": False},
        "error_feedback": True,  # φ_err(o_i, H_t): on by default (the paper), independent of C_t
        "cues": [],
    }
    assert initial_interface(EvolveConfig(error_feedback="adaptive", schema_types=True))["error_feedback"] is False
    release = initial_interface(EvolveConfig(schema_wording="release", schema_revealed=False))["schema"]
    assert release["release_wording"] is True and release["skip_revealed"] is True
    assert initial_interface(EvolveConfig(schema_types=True))["schema"]["types"] is True


def test_cues_follow_thresholds_and_pressure():
    p = profile(
        **{
            EMPTY: (40, 0.40, 0.1),  # pressure 0.36
            STATE: (20, 0.20, 0.2),  # 0.16
            INST: (11, 0.11, 0.0),  # 0.11
            RESP: (12, 0.12, 0.5),  # 0.06: eligible, but 4th
            SPUR: (5, 0.30, 0.0),  # too few occurrences
            "correct_abstention": (50, 0.5, 0.0),  # a success tag: never a cue
            "pass": (30, 0.3, 0.0),
        }
    )
    out = evolve(initial_interface(EvolveConfig()), p, EvolveConfig(error_feedback="off"))
    assert cue_tags(out) == [EMPTY, INST, STATE]  # top 3 by pressure, listed in the fixed cue order
    assert all(c["text"] == CUE_TEXTS[c["tag"]] for c in out["cues"])
    assert out["version"] == 1


@pytest.mark.parametrize(
    ("stats", "enters"),
    [
        ((8, 0.10, 0.59), True),  # every threshold just met
        ((7, 0.10, 0.0), False),  # count below min_tag_count
        ((50, 0.099, 0.0), False),  # prevalence below 0.10
        ((50, 0.5, 0.6), False),  # reward_mean must be < 0.6
    ],
)
def test_entry_thresholds(stats, enters):
    out = evolve(initial_interface(EvolveConfig()), profile(**{STATE: stats}), EvolveConfig())
    assert (cue_tags(out) == [STATE]) is enters


def test_hysteresis_keeps_incumbents_until_clearly_below():
    cfg = EvolveConfig()  # hysteresis 0.25: stay while prevalence >= 0.075, reward_mean < 0.75, count >= 6
    both = profile(**{STATE: (10, 0.08, 0.3), RESP: (10, 0.08, 0.3)})
    out = evolve(with_cues(STATE, error_feedback=True), both, cfg)
    assert cue_tags(out) == [STATE]  # incumbent stays, the identical newcomer does not enter
    assert out["version"] == 3  # nothing changed
    assert cue_tags(evolve(with_cues(STATE), profile(**{STATE: (10, 0.07, 0.3)}), cfg)) == []
    assert cue_tags(evolve(with_cues(STATE), profile(**{STATE: (10, 0.5, 0.7)}), cfg)) == [STATE]
    assert cue_tags(evolve(with_cues(), profile(**{STATE: (10, 0.5, 0.7)}), cfg)) == []
    assert cue_tags(evolve(with_cues(STATE), profile(**{STATE: (6, 0.5, 0.0)}), cfg)) == [STATE]
    assert cue_tags(evolve(with_cues(STATE), profile(**{STATE: (5, 0.5, 0.0)}), cfg)) == []


def test_incumbents_rank_with_a_bonus():
    cfg = EvolveConfig(max_cues=1)
    # incumbent pressure 0.2 -> ranks as 0.25; newcomer 0.22 does not displace it, 0.3 does
    p = profile(**{STATE: (20, 0.25, 0.2), EMPTY: (20, 0.22, 0.0)})
    assert cue_tags(evolve(with_cues(STATE), p, cfg)) == [STATE]
    p = profile(**{STATE: (20, 0.25, 0.2), EMPTY: (20, 0.30, 0.0)})
    assert cue_tags(evolve(with_cues(STATE), p, cfg)) == [EMPTY]


def test_version_changes_only_with_content():
    cfg = EvolveConfig()
    p = profile(**{STATE: (20, 0.2, 0.0)})
    first = evolve(initial_interface(cfg), p, cfg)
    second = evolve(first, p, cfg)
    assert first["version"] == 1 and second == first
    third = evolve(second, profile(**{EMPTY: (20, 0.2, 0.0)}), cfg)
    assert third["version"] == 2 and cue_tags(third) == [EMPTY]
    assert evolve(third, profile(), EvolveConfig(schema_types=True))["version"] == 3  # schema change counts


@pytest.mark.parametrize(
    ("vocabulary", "tags", "mode", "incumbent", "expected"),
    [
        ("progress", {EMPTY: (6, 0.06, 0.0), SPUR: (5, 0.05, 0.0)}, "adaptive", False, True),  # 0.11, 11
        ("progress", {EMPTY: (4, 0.04, 0.0), SPUR: (4, 0.04, 0.0)}, "adaptive", False, False),  # 0.08
        ("progress", {EMPTY: (4, 0.04, 0.0), SPUR: (4, 0.04, 0.0)}, "adaptive", True, True),  # stays >= .075
        ("progress", {EMPTY: (7, 0.07, 0.0)}, "adaptive", True, False),  # clearly below
        ("progress", {STATE: (90, 0.9, 0.0)}, "adaptive", False, False),  # not an error-feedback tag
        ("paper", {"argument_mismatch": (12, 0.12, 0.0)}, "adaptive", False, True),
        ("paper", {EMPTY: (12, 0.12, 0.0)}, "adaptive", False, False),  # progress tag, paper config
        ("progress", {}, "on", False, True),
        ("progress", {EMPTY: (90, 0.9, 0.0)}, "off", True, False),
    ],
)
def test_error_feedback_modes(vocabulary, tags, mode, incumbent, expected):
    cfg = EvolveConfig(vocabulary=vocabulary, error_feedback=mode)
    out = evolve(with_cues(error_feedback=incumbent), profile(**tags), cfg)
    assert out["error_feedback"] is expected


def test_cue_overrides_and_explicit_zero():
    p = profile(**{STATE: (20, 0.2, 0.0), EMPTY: (20, 0.3, 0.0)})
    cfg = EvolveConfig(cue_texts={EMPTY: None, STATE: "Check the current state first."})
    out = evolve(initial_interface(cfg), p, cfg)
    assert out["cues"] == [{"tag": STATE, "text": "Check the current state first."}]
    assert evolve(initial_interface(cfg), p, EvolveConfig(max_cues=0))["cues"] == []
    release = EvolveConfig(max_cues=0, release_zero_fallback=True)
    assert release.max_cues == 3
    with pytest.raises(ValueError):
        EvolveConfig(cue_texts={"pass": "well done"})
    with pytest.raises(ValueError):
        EvolveConfig(cue_texts={STATE: "two\nlines"})
    with pytest.raises(ValueError):
        EvolveConfig(vocabulary="paper", error_tags=["empty_turn_model_response"])
    assert EvolveConfig(error_tags=("state_mismatch",)).feedback_tags() == ("state_mismatch",)
    # The knobs' declared ranges and value sets are checked where a run's config is built: the recipe.
    for override, message in (("seal.interface.max_cues=9", r"seal.interface.max_cues: must lie in \[0, 8\]"),
                              ("seal.interface.max_lines=3", "seal.interface.max_lines: unknown key"),
                              ("seal.interface.error_feedback=sometimes", "seal.interface.error_feedback: must be one"),
                              ("seal.interface.hysteresis=1.5", r"seal.interface.hysteresis: must lie in \[0, 1\]")):
        with pytest.raises(ConfigError, match=message):
            load_config(None, [override])


def test_validate_interface_rejects_bad_shapes():
    good = initial_interface(EvolveConfig())
    assert validate_interface(good) == good
    for bad in (
        {**good, "version": -1},
        {**good, "version": True},
        {**good, "schema": {"required": True, "enums": True}},
        {**good, "error_feedback": "yes"},
        {**good, "cues": [{"tag": STATE}]},
        {**good, "cues": [{"tag": STATE, "text": "two\nlines"}]},
    ):
        with pytest.raises(ValueError):
            validate_interface(bad)
    with pytest.raises(TypeError):
        validate_interface([])


def test_validate_interface_reads_a_partial_interface_as_the_service_does():
    # One rule set with env_service (protocol.parse_omega): a missing key is "off", and the trainer keeps
    # the complete form, so evolve and the metrics always find every key.
    good = initial_interface(EvolveConfig())
    assert validate_interface({k: v for k, v in good.items() if k != "cues"}) == good
    assert validate_interface({**good, "schema": {"required": True}})["schema"] == {
        "required": True, "enum": False, "types": False, "hide_optional": False, "release_wording": False,
        "skip_revealed": False}
    assert validate_interface({}) == {"version": 0, "error_feedback": False, "cues": [],
                                      "schema": dict.fromkeys(SCHEMA_KEYS, False)}
    cfg = EvolveConfig(cues=False, error_feedback="off")
    assert evolve({"version": 2}, profile(), cfg) == {**initial_interface(cfg), "version": 3}


def test_interface_metrics():
    m = interface_metrics(with_cues(STATE, error_feedback=True, version=4))
    assert m == {"interface/version": 4.0, "interface/error_feedback": 1.0, "interface/num_cues": 1.0,
                 f"interface/cue/{STATE}": 1.0}


# ------------------------------------------------------------------ cue texts
FAILURE_TAGS = (set(PROGRESS_TAGS) | set(PAPER_LABELS)) - SUCCESS_TAGS - EXCLUDED_TAGS


def test_every_failure_tag_of_both_vocabularies_has_its_own_cue():
    assert set(CUE_TEXTS) == FAILURE_TAGS
    assert len(set(CUE_TEXTS.values())) == len(CUE_TEXTS)
    assert all(20 < len(text) < 200 and "\n" not in text for text in CUE_TEXTS.values())


def _bfcl_tool_names() -> set[str]:
    spec = importlib.util.find_spec("bfcl_eval")  # finds the package without importing it
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("bfcl-eval not installed")
    doc_dir = Path(next(iter(spec.submodule_search_locations))) / "data" / "multi_turn_func_doc"
    names: set[str] = set()
    for path in doc_dir.glob("*.json"):
        for line in path.read_text(encoding="utf-8").splitlines():
            if line.strip():
                names.add(json.loads(line)["name"])
    return names


def test_cue_texts_never_name_a_tool():
    names = _bfcl_tool_names()
    assert len(names) > 100
    for tag, text in CUE_TEXTS.items():
        words = set(re.findall(r"[A-Za-z_]+", text))
        assert not words & names, f"cue for {tag} names BFCL tools {sorted(words & names)}"


def test_evolved_interfaces_pass_the_services_validation():
    # Contract with env_service/interface.py: whatever evolve produces, the service accepts.
    from env_service.interface import MAX_CUES, parse_interface

    every_tag = profile(**{tag: (50, 0.5, 0.0) for tag in FAILURE_TAGS})
    for vocabulary in ("progress", "paper"):
        cfg = EvolveConfig(vocabulary=vocabulary, max_cues=MAX_CUES, error_feedback="adaptive")
        omega = evolve(initial_interface(cfg), every_tag, cfg)
        assert len(omega["cues"]) == MAX_CUES and omega["error_feedback"] is True
        parsed = parse_interface(omega)
        assert [c.tag for c in parsed.cues] == cue_tags(omega)
        parse_interface(initial_interface(cfg))


def test_cue_prevalence_over_failures_is_the_release_cue_rule():
    # 100 non-excluded turns: 80 pass, 12 state mismatches, 8 response mismatches (reward 0)
    p = profile(**{"pass": (80, 0.80, 1.0), STATE: (12, 0.12, 0.0), RESP: (8, 0.08, 0.0)})
    # over all turns only the state mismatch reaches 10 %; over the 20 failures both do (60 %, 40 %)
    assert cue_tags(evolve(initial_interface(EvolveConfig()), p, EvolveConfig())) == [STATE]
    release = EvolveConfig(cue_prevalence="failures")
    assert sorted(cue_tags(evolve(initial_interface(release), p, release))) == sorted([STATE, RESP])


def test_cue_tie_break_by_name_or_first_seen_as_the_release():
    from seal.core.capability import CapabilityState
    from seal.core.record import EpisodeRecord

    state = CapabilityState("progress")
    # two failure tags of equal pressure; state_mismatch is seen first, but sorts after empty_turn by name
    state.observe([EpisodeRecord("multi_turn_base_0", failure_tags=(STATE,), accuracy=0.0)] * 10
                  + [EpisodeRecord("multi_turn_long_context_0", failure_tags=(EMPTY,), accuracy=0.0)] * 10)
    p = state.profile("window")
    assert p.tags[STATE].pressure == p.tags[EMPTY].pressure
    assert p.first_seen == (STATE, EMPTY)
    ours = EvolveConfig(max_cues=1)
    assert cue_tags(evolve(initial_interface(ours), p, ours)) == [EMPTY]
    release = EvolveConfig(max_cues=1, cue_tie_break="first_seen")
    assert cue_tags(evolve(initial_interface(release), p, release)) == [STATE]
    # the order survives a checkpoint (JSON keeps key order)
    restored = CapabilityState("progress", run_id=state.run_id)
    restored.load_state_dict(json.loads(json.dumps(state.state_dict())), force=True)
    assert restored.profile("window").first_seen == (STATE, EMPTY)

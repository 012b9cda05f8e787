"""Interface evolution: Ω_{t+1} = Evolve(Ω_t, C_t) (docs/paper.md §4).

The trainer calls ``evolve`` once per training step, after the capability state has observed the
step's rollouts, and sends the result with the next *training* episodes. Evaluation episodes never
get an interface (the env service refuses one), so ``evolve`` is never asked for them.

An interface is the JSON of the protocol's Ω model (``env_service.protocol.Interface``, docs/protocol.md)::

    {"version": int,
     "schema": {"required": bool, "enum": bool, "types": bool, "hide_optional": bool},
     "error_feedback": bool,
     "cues": [{"tag": str, "text": str}]}

* φ_schema — static switches from the config (release SEAL: required + enum hints on, docs/release_behaviour.md §6.1).
* φ_err — ``on`` (the paper: φ_err(o_i, H_t) turns each error observation into recovery-oriented feedback and
  does not depend on C_t), ``off`` (the release), or ``adaptive`` (ours: on while the tags that error feedback
  can help with, ``ERROR_FEEDBACK_TAGS``, are prevalent in C_t; needs the closed loop).
* φ_cap — up to ``max_cues`` cue lines for the tags under the most pressure (prevalence ·
  (1 − reward_mean)), subject to the release's thresholds (docs/release_behaviour.md §6.3). Prevalence is C_t's
  (over all non-excluded turn tags, as the dynamic weights read it); ``cue_prevalence: failures`` takes it over
  failure tags only, as the release's (disabled) cue rule did.

Both adaptive parts use hysteresis so the interface does not flap from step to step: a cue (or
error feedback) *enters* when the thresholds are met and *stays* until the profile falls clearly
below them (every threshold relaxed by the factor ``hysteresis``); incumbents also rank with their
pressure multiplied by ``1 + hysteresis`` against newcomers. The incumbent set is read from Ω_t
itself, so ``evolve`` stays a pure function. ``version`` increases only when the content changes.

Cue texts are ours; they describe behaviour only — no tool names, argument values or reference
trajectories (the interface must never leak the correct tool or hidden parameters).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import replace
from typing import Any, ClassVar, Literal

from pydantic import model_validator

from env_service import vocab
from env_service.protocol import MAX_CUE_TEXT_CHARS, MAX_CUES, parse_omega
from seal.core.profile import FailureProfile, TagProfile
from seal.core.section import Section, setting
from seal.core.weights import UNKNOWN_TAG, check_vocabulary, known_tags

ERROR_FEEDBACK_MODES = ("off", "on", "adaptive")
SCHEMA_WORDINGS = ("ours", "release")
# φ_cap's prevalence denominator: all non-excluded turn tags (the C_t that the dynamic weights use too), or
# failure tags only (the release's cue rule, which leaves out pass, correct_abstention and unknown).
CUE_PREVALENCE_BASES = ("all", "failures")
# φ_cap's order among tags of equal pressure at the max_cues cut: by tag name (ours, independent of arrival
# order), or the order C_t's statistics first saw them (the release: a stable sort of its count dict).
CUE_TIE_BREAKS = ("name", "first_seen")

# Tags whose turns error feedback can help recover (ours).
# paper: the three labels the paper ties to parse/schema/execution errors.
# progress: the release's tags have no error label; a malformed or unavailable call is rejected, so
# the turn ends without an accepted call (empty_turn_model_response), and a call to a held-out or
# absent tool on a turn that needs none is a spurious_tool_call. Both are what φ_err's messages address.
ERROR_FEEDBACK_TAGS: dict[str, tuple[str, ...]] = {
    "paper": (vocab.INVALID_TOOL_CALL, vocab.ARGUMENT_MISMATCH, vocab.RECOVERY_FAILURE),
    "progress": (vocab.EMPTY_TURN, vocab.SPURIOUS_TOOL_CALL),
}

# Our cue lines, one per failure tag of both vocabularies (shared tags share a line).
CUE_TEXTS: dict[str, str] = {
    vocab.SPURIOUS_TOOL_CALL: (
        "Call a tool only when one of the listed tools really fits the request; if none does, "
        "say so in plain words instead of making up a call."
    ),
    vocab.EMPTY_TURN: (
        "If a listed tool can do what the user asked, make the call in this turn; "
        "describing the action in text does not carry it out."
    ),
    vocab.BUDGET_EXCEEDED: (  # ours: the env service's cost budget (env_service/budget.py)
        "Keep every call to the size the request needs: a call that does huge work or returns huge "
        "output ends the episode."
    ),
    vocab.INSTANCE_MISMATCH: (
        "Work with the service the request is about; leave the tools of other services alone "
        "unless the request needs them."
    ),
    vocab.STATE_MISMATCH: (
        "Before a call that changes something, check the latest tool outputs and make sure "
        "your arguments fit the current state."
    ),
    vocab.RESPONSE_MISMATCH: (
        "When the user asks for information, fetch it with a tool call in this turn instead of "
        "answering from memory or from older results."
    ),
    vocab.INVALID_TOOL_CALL: (
        "Write each tool call as one well-formed JSON object that names a tool from the current "
        "list; calls to unlisted tools are rejected."
    ),
    vocab.ARGUMENT_MISMATCH: (
        "Give every required argument, with the documented type, and copy allowed values exactly "
        "as the tool description spells them."
    ),
    vocab.RECOVERY_FAILURE: (
        "When a tool reports an error, read it, fix the cause and retry, rather than repeating "
        "the same call or moving on."
    ),
    vocab.MISSING_TOOL_CALL: (
        "Do not answer before every step the request needs has been done with the tools; "
        "a task that needs several calls needs all of them."
    ),
}

# Tags that never get a cue: successes, harness errors, missing diagnoses.
NON_CUE_TAGS: frozenset[str] = vocab.SUCCESS_TAGS | vocab.EXCLUDED_TAGS | {UNKNOWN_TAG}


class EvolveSettings(Section):
    """The interface-evolution knobs a recipe sets (in ``seal.interface``): all but the vocabulary.

    The vocabulary is chosen once for every SEAL component (``seal.diagnosis.vocabulary``);
    ``EvolveConfig`` adds it.
    """

    schema_required: bool = setting(True, source="release", help="phi_schema: mark required parameters")
    schema_enum: bool = setting(True, source="release", help="phi_schema: list the allowed values of enum parameters")
    schema_types: bool = setting(False, source="release", help="phi_schema: spell out parameter types")
    schema_hide_optional: bool = setting(False, source="release", help="phi_schema: hide optional parameters")
    schema_wording: Literal[SCHEMA_WORDINGS] = setting(
        "ours", source="ours",
        help="phi_schema markers and instruction: ours | release (the release's exact text)")
    schema_revealed: bool = setting(True, source="ours",
                                    help="phi_schema also annotates docs revealed at a miss_func turn (release: false)")
    error_feedback: Literal[ERROR_FEEDBACK_MODES] = setting(
        "on", source="paper",
        help="phi_err(o_i, H_t): on | off | adaptive (ours: on while error tags are "
             "prevalent in C_t; needs closed_loop); release: off")
    error_tags: tuple[str, ...] | None = setting(None, source="ours",
                                                 help="tags that switch adaptive phi_err on; null = per vocabulary")
    error_threshold: float = setting(0.10, source="ours", ge=0, le=1,
                                     help="combined prevalence of error_tags that switches phi_err on")
    error_min_count: int = setting(8, source="ours", ge=0, help="combined occurrences of error_tags needed for phi_err")
    cues: bool = setting(True, source="paper", help="phi_cap: capability cues from C_t (release: off)")
    cue_prevalence: Literal[CUE_PREVALENCE_BASES] = setting(
        "all", source="ours",
        help="phi_cap prevalence over all non-excluded turn tags (the shared C_t) | "
             "failures (release cue rule)")
    cue_tie_break: Literal[CUE_TIE_BREAKS] = setting(
        "name", source="ours",
        help="phi_cap order of equal-pressure tags at the max_cues cut: name | first_seen "
             "(the release)")
    prevalence_threshold: float = setting(0.10, source="release", ge=0, le=1,
                                          help="phi_cap: a tag needs at least this prevalence")
    reward_threshold: float = setting(0.6, source="release", ge=0, le=1,
                                      help="phi_cap: a tag needs reward_mean below this")
    min_tag_count: int = setting(8, source="release", ge=0, help="phi_cap: a tag needs at least this many occurrences")
    max_cues: int = setting(3, source="release", ge=0, le=MAX_CUES,
                            help="phi_cap: most cue lines in one interface")
    cue_texts: dict[str, str | None] = setting(
        {}, source="release",
        help="per-tag cue text overrides (release guidelines); null removes a cue")
    hysteresis: float = setting(0.25, source="ours", ge=0, le=1,
                                 help="relative margin for leaving, and incumbents' ranking bonus")
    release_zero_fallback: bool = setting(
        False, source="ours", help="true = the release's `value or default` parsing of the phi_cap thresholds")

    RELEASE_OR_DEFAULT_FIELDS: ClassVar[tuple[str, ...]] = (
        "prevalence_threshold", "reward_threshold", "min_tag_count", "max_cues")

    @model_validator(mode="after")
    def _check_settings(self) -> EvolveSettings:
        bad = sorted(
            k for k, v in self.cue_texts.items()
            if k in NON_CUE_TAGS or not (v is None or ("\n" not in v and len(v.strip()) <= MAX_CUE_TEXT_CHARS))
        )
        if bad:
            raise ValueError(
                f"evolve.cue_texts: invalid entries {bad} (failure tags only; one line of at most "
                f"{MAX_CUE_TEXT_CHARS} characters, or null)"
            )
        return self


class EvolveConfig(EvolveSettings):
    """Interface-evolution knobs bound to a diagnosis vocabulary (what ``evolve`` reads)."""

    vocabulary: str = setting("progress", source="ours", help="which tags C_t holds: progress | paper")

    @model_validator(mode="after")
    def _check_vocabulary(self) -> EvolveConfig:
        check_vocabulary(self.vocabulary)
        if self.error_tags is not None:
            unknown = sorted(set(self.error_tags) - known_tags(self.vocabulary))
            if unknown:
                raise ValueError(f"evolve.error_tags: {unknown} are not tags of the {self.vocabulary!r} vocabulary")
        return self

    @classmethod
    def bind(cls, settings: EvolveSettings, vocabulary: str) -> EvolveConfig:
        """The evolution knobs of ``settings`` (an ``EvolveSettings`` or a subclass) with the run's vocabulary."""
        names = EvolveSettings.model_fields
        return cls.model_validate({**{k: v for k, v in dict(settings).items() if k in names}, "vocabulary": vocabulary})

    def texts(self) -> dict[str, str]:
        """Cue text per tag after overrides (a ``None`` override removes the tag's cue)."""
        merged: dict[str, str | None] = {**CUE_TEXTS, **self.cue_texts}
        return {tag: text for tag, text in merged.items() if text}

    def feedback_tags(self) -> tuple[str, ...]:
        return self.error_tags if self.error_tags is not None else ERROR_FEEDBACK_TAGS[self.vocabulary]


def _schema(cfg: EvolveConfig) -> dict[str, bool]:
    return {
        "required": cfg.schema_required,
        "enum": cfg.schema_enum,
        "types": cfg.schema_types,
        "hide_optional": cfg.schema_hide_optional,
        "release_wording": cfg.schema_wording == "release",
        "skip_revealed": not cfg.schema_revealed,
    }


def initial_interface(cfg: EvolveConfig) -> dict[str, Any]:
    """Ω_0: the schema switches, error feedback only when fixed ``on``, no cues."""
    return {"version": 0, "schema": _schema(cfg), "error_feedback": cfg.error_feedback == "on", "cues": []}


def validate_interface(omega: Mapping[str, Any]) -> dict[str, Any]:
    """Ω through the protocol's one rule set (``env_service.protocol.parse_omega``, which the env service
    applies to every create request); returns Ω's complete form, every key present.

    A partial Ω is read as the service reads it (a missing key is "off"). A malformed one raises
    ``InterfaceError`` (a ``ValueError``) with the message the service's 422 would carry; a non-mapping
    raises ``InterfaceTypeError`` (also a ``TypeError``).
    """
    return parse_omega(omega).to_dict()


def _error_feedback(omega: Mapping[str, Any], profile: FailureProfile, cfg: EvolveConfig) -> bool:
    if cfg.error_feedback != "adaptive":
        return cfg.error_feedback == "on"
    stats = [profile.tags[t] for t in cfg.feedback_tags() if t in profile.tags]
    prevalence = sum(s.prevalence for s in stats)
    count = sum(s.count for s in stats)
    if omega["error_feedback"]:  # incumbent: stays on until clearly below the threshold
        relax = 1.0 - cfg.hysteresis
        return prevalence >= cfg.error_threshold * relax and count >= math.ceil(cfg.error_min_count * relax)
    return count > 0 and prevalence >= cfg.error_threshold and count >= cfg.error_min_count


def _cue_tags(
    omega: Mapping[str, Any], profile: FailureProfile, cfg: EvolveConfig, texts: Mapping[str, str]
) -> list[str]:
    if not cfg.cues or cfg.max_cues == 0:
        return []
    incumbents = {c["tag"] for c in omega["cues"]}
    relax = 1.0 - cfg.hysteresis
    ranked: list[tuple[float, str]] = []
    failures = sum(s.count for t, s in profile.tags.items() if t not in NON_CUE_TAGS)
    for tag, stat in profile.tags.items():
        if tag not in texts or tag in NON_CUE_TAGS:
            continue
        if cfg.cue_prevalence == "failures":
            stat = cue_stat_over_failures(stat, failures)
        if tag in incumbents:
            keep = (
                stat.count >= math.ceil(cfg.min_tag_count * relax)
                and stat.prevalence >= cfg.prevalence_threshold * relax
                and stat.reward_mean < min(1.0, cfg.reward_threshold * (1.0 + cfg.hysteresis))
            )
            score = stat.pressure * (1.0 + cfg.hysteresis)
        else:
            keep = (
                stat.count >= cfg.min_tag_count
                and stat.prevalence >= cfg.prevalence_threshold
                and stat.reward_mean < cfg.reward_threshold
            )
            score = stat.pressure
        if keep:
            ranked.append((score, tag))
    # highest score first; ties by tag name (deterministic whatever the arrival order) or, as the release, first seen
    if cfg.cue_tie_break == "first_seen":
        seen = {tag: i for i, tag in enumerate(profile.first_seen)}
        ranked.sort(key=lambda x: (-x[0], seen.get(x[1], len(seen)), x[1]))
    else:
        ranked.sort(key=lambda x: (-x[0], x[1]))
    chosen = {tag for _, tag in ranked[: cfg.max_cues]}
    return [tag for tag in texts if tag in chosen]  # stable order: CUE_TEXTS order, then overrides


def cue_stat_over_failures(stat: TagProfile, failures: int) -> TagProfile:
    """A tag's profile with prevalence (and pressure) over failure-tag occurrences only, as the release's cue
    rule computes them (its total leaves out pass, correct_abstention and unknown besides the harness tags)."""
    prevalence = stat.count / failures if failures else 0.0
    return replace(stat, prevalence=prevalence, pressure=prevalence * (1.0 - stat.reward_mean))


def evolve(omega: Mapping[str, Any], profile: FailureProfile, cfg: EvolveConfig) -> dict[str, Any]:
    """Ω_{t+1} from Ω_t and the failure profile C_t. Pure; never for evaluation episodes."""
    omega = validate_interface(omega)
    texts = cfg.texts()
    content = {
        "schema": _schema(cfg),
        "error_feedback": _error_feedback(omega, profile, cfg),
        "cues": [{"tag": tag, "text": texts[tag]} for tag in _cue_tags(omega, profile, cfg, texts)],
    }
    old = {"schema": dict(omega["schema"]), "error_feedback": omega["error_feedback"],
           "cues": [{"tag": c["tag"], "text": c["text"]} for c in omega["cues"]]}
    version = omega["version"] + (1 if content != old else 0)
    return {"version": version, **content}


def interface_metrics(omega: Mapping[str, Any]) -> dict[str, float]:
    """``interface/*`` metrics: version, error feedback, number of cues and one flag per cue tag."""
    out = {
        "interface/version": float(omega["version"]),
        "interface/error_feedback": float(omega["error_feedback"]),
        "interface/num_cues": float(len(omega["cues"])),
    }
    for cue in omega["cues"]:
        out[f"interface/cue/{cue['tag']}"] = 1.0
    return out

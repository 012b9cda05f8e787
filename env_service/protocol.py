"""The wire protocol of the environment service as typed models (documented in docs/protocol.md).

One definition serves both ends: the FastAPI app validates request bodies and serialises replies with these
models, and the trainer's client (``seal.rollout.client``) builds its requests from them and parses every reply
into them, so a field renamed on one side fails the other side's tests instead of a training run.

Three kinds of models:

* Requests (``CreateRequest``, ``StepRequest``) refuse unknown fields: a misspelt field is a bug in the caller
  and silently ignoring it would run an episode with settings nobody asked for.
* Replies ignore unknown fields, so a client keeps working against a service that has grown a field; the tests
  dump every real reply back and compare, so a field the models do not know cannot go unnoticed here.
* The train-only interface Ω (``Interface``, with ``SchemaSwitches`` and ``Cue``) is frozen pydantic
  dataclasses: the trainer's ``evolve`` output and the service's parsing both go through ``parse_omega``, so
  there is one set of rules and one error message for a malformed Ω on either side.

Ω's rule set: every key is optional and a missing key or ``null`` means "off" (``{}`` is the raw interface).
That is the rule the wire has always had, so no payload a client sends today changes meaning; the trainer,
which used to insist on all four keys, now reads a partial Ω as its complete form (``Interface.to_dict``) and
persists only that form. Unknown keys, wrong types and out-of-range values are refused on both sides.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictInt,
    StrictStr,
    TypeAdapter,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic.dataclasses import dataclass

# =====================================================================================================
# Error envelope and codes
# =====================================================================================================

# Every error the service answers, with its HTTP status. The app raises errors by code only, so a code and
# its status cannot drift apart; docs/protocol.md lists the same table (a test compares them).
ERROR_STATUS: dict[str, int] = {
    "malformed_json": 400,  # the body is not JSON
    "unknown_split": 400,  # GET /tasks?split= names no split
    "interface_in_eval": 400,  # an evaluation episode was sent an interface
    "unauthorized": 401,  # missing or wrong bearer token
    "held_out_task": 403,  # GET /tasks/{id}/replay names a task outside the training split
    "eval_task_in_training": 403,  # POST /episodes in train mode on an eval-split task (service flag allows it)
    "not_found": 404,  # no such route
    "unknown_task": 404,  # POST /episodes names no task
    "unknown_episode": 404,  # the episode is finished and deleted, expired, or never existed
    "method_not_allowed": 405,  # the route exists, the method does not
    "episode_exists": 409,  # POST /episodes with an episode_id that is open
    "episode_finished": 409,  # a step after the episode was done or evaluated
    "body_too_large": 413,  # the body exceeds the service's limit
    "invalid_request": 422,  # a body field is missing, unknown or of the wrong type
    "invalid_interface": 422,  # the interface Ω breaks its rules
    "invalid_episode_id": 422,  # a client-chosen episode_id with characters outside [A-Za-z0-9_.-]
    "internal_error": 500,  # an unexpected exception inside one request (the service keeps serving)
    "too_many_episodes": 503,  # the open-episode limit is reached even after expiring idle episodes
}
# Starlette's own HTTP errors with a status outside the table above keep their status under this code.
HTTP_ERROR = "http_error"



class _Request(BaseModel):
    model_config = ConfigDict(extra="forbid")


class _Reply(BaseModel):
    model_config = ConfigDict(extra="ignore")


class ErrorBody(_Reply):
    code: str  # a key of ERROR_STATUS (or HTTP_ERROR); a str, so a client reads codes it does not know yet
    message: str


class ErrorReply(_Reply):
    """The body of every 4xx/5xx reply."""

    error: ErrorBody


# =====================================================================================================
# The train-only interface Ω
# =====================================================================================================

# Limits (ours): they keep the system prompt bounded whatever the trainer sends.
MAX_CUES = 8  # cue lines per interface
MAX_CUE_TEXT_CHARS = 300  # characters per cue text
MAX_CUE_TAG_CHARS = 64  # characters per cue tag

SCHEMA_KEYS: tuple[str, ...] = ("required", "enum", "types", "hide_optional", "release_wording", "skip_revealed")
INTERFACE_KEYS: tuple[str, ...] = ("version", "schema", "error_feedback", "cues")
CUE_KEYS: tuple[str, ...] = ("tag", "text")
_CUE_TAG_RE = re.compile(r"[A-Za-z0-9_.:\-]+")  # matched whole (fullmatch): `$` would admit a final "\n"
_CONTROL_RE = re.compile(r"[\x00-\x1f\x7f]")


class InterfaceError(ValueError):
    """A malformed interface Ω (the service answers 422 ``invalid_interface`` with this message)."""


class InterfaceTypeError(InterfaceError, TypeError):
    """Ω is not an object at all (a TypeError too, for callers that check argument types)."""


_OMEGA = ConfigDict(extra="forbid")


def _none_means_default(cls: type, value: Any, field_name: str) -> Any:
    # ``null`` counts as a missing key, so that a sender may spell "off" either way.
    return cls.__dataclass_fields__[field_name].default if value is None else value


@dataclass(frozen=True, config=_OMEGA)
class SchemaSwitches:
    """φ_schema switches; all off (= raw tool docs) by default.

    required: mark required parameters (release default on in SEAL.yaml).
    enum: state the accepted values of enum-like parameters (release: only structured ``enum`` lists,
        which BFCL multi-turn docs never have; ours: also the enums written in description text).
    types: state each parameter's declared type (release option, off in SEAL.yaml).
    hide_optional: drop parameters that are not required (release option, off in SEAL.yaml; note that
        544 of the 4,625 BFCL multi-turn ground-truth calls use an optional parameter).
    release_wording: the release's markers and instruction line, enums from structured ``enum`` lists only
        (reproduces the release's training system prompt byte for byte; docs/interface.md).
    skip_revealed: leave the docs revealed at a miss_func turn unannotated, as the release does.
    The last two modify how the first four render; alone they change nothing.
    """

    required: StrictBool = False
    enum: StrictBool = False
    types: StrictBool = False
    hide_optional: StrictBool = False
    release_wording: StrictBool = False
    skip_revealed: StrictBool = False

    @field_validator("*", mode="before")
    @classmethod
    def _null(cls, value: Any, info: Any) -> Any:
        return _none_means_default(cls, value, info.field_name)

    @property
    def any_on(self) -> bool:
        return self.required or self.enum or self.types or self.hide_optional

    def to_dict(self) -> dict[str, bool]:
        return {k: getattr(self, k) for k in SCHEMA_KEYS}


@dataclass(frozen=True, config=_OMEGA)
class Cue:
    """One φ_cap line: the failure tag that selected it (for logs) and the text shown to the model."""

    tag: StrictStr
    text: StrictStr

    @field_validator("tag")
    @classmethod
    def _tag(cls, tag: str) -> str:
        if not tag:
            raise ValueError("must be a non-empty string")
        if len(tag) > MAX_CUE_TAG_CHARS or not _CUE_TAG_RE.fullmatch(tag):
            raise ValueError(f"must be at most {MAX_CUE_TAG_CHARS} characters of [A-Za-z0-9_.:-], got {tag!r}")
        return tag

    @field_validator("text")
    @classmethod
    def _text(cls, text: str) -> str:
        text = text.strip()
        if not text:
            raise ValueError("must be a non-empty string")
        if len(text) > MAX_CUE_TEXT_CHARS:
            raise ValueError(f"has {len(text)} characters; the limit is {MAX_CUE_TEXT_CHARS}")
        # A cue renders as one "- <text>" line: a line break or control character could forge prompt
        # structure, so it is refused rather than silently rewritten.
        if _CONTROL_RE.search(text):
            raise ValueError("must be a single line without control characters")
        return text


@dataclass(frozen=True, config=_OMEGA)
class Interface:
    """The train-only interface Ω_t: what the trainer sends with a training episode (docs/interface.md).

    version: the trainer's counter; it increases when the content changes and changes nothing the model sees.
    schema: the φ_schema switches. error_feedback: φ_err (recovery hints after rejected or failed calls).
    cues: φ_cap lines appended to the system prompt, at most ``MAX_CUES``.
    """

    version: Annotated[StrictInt, Field(ge=0)] = 0
    schema: SchemaSwitches = SchemaSwitches()
    error_feedback: StrictBool = False
    cues: Annotated[tuple[Cue, ...], Field(max_length=MAX_CUES)] = ()

    @field_validator("*", mode="before")
    @classmethod
    def _null(cls, value: Any, info: Any) -> Any:
        return _none_means_default(cls, value, info.field_name)

    @property
    def is_raw(self) -> bool:
        """True when the interface changes nothing the model sees (``version`` alone changes nothing)."""
        return not (self.schema.any_on or self.error_feedback or self.cues)

    def to_dict(self) -> dict[str, Any]:
        """The complete JSON form (every key present): what the trainer sends and persists."""
        return {
            "version": self.version,
            "schema": self.schema.to_dict(),
            "error_feedback": self.error_feedback,
            "cues": [{"tag": c.tag, "text": c.text} for c in self.cues],
        }


RAW_INTERFACE = Interface()

_INTERFACE = TypeAdapter(Interface)
_SCHEMA = TypeAdapter(SchemaSwitches)
_CUE = TypeAdapter(Cue)


def _where(loc: tuple[Any, ...]) -> str:
    out = "interface"
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else f".{part}"
    return out


def _allowed_keys(parent: tuple[Any, ...]) -> tuple[str, ...]:
    if not parent:
        return INTERFACE_KEYS
    return SCHEMA_KEYS if parent[-1] == "schema" else CUE_KEYS


def interface_error_message(exc: ValidationError, prefix: tuple[Any, ...] = ()) -> str:
    """One message naming the offending field (``interface.cues[0].text ...``) for a failed Ω validation.

    Only the first problem is reported, as a person fixing the payload reads it; ``prefix`` places a part that
    was validated on its own (``schema``, one cue) where it sits in Ω.
    """
    errors = exc.errors(include_url=False)
    first = errors[0]
    loc = prefix + tuple(first["loc"])
    kind, where, got = first["type"], _where(loc), first.get("input")
    if kind == "invalid_key":
        return f"{_where(loc[:-1])}: keys must be strings, got {loc[-1]!r}"
    if kind == "unexpected_keyword_argument":
        parent = loc[:-1]
        unknown = sorted(
            str(e["loc"][-1]) for e in errors
            if e["type"] == "unexpected_keyword_argument" and prefix + tuple(e["loc"][:-1]) == parent
        )
        return f"{_where(parent)}: unknown key(s) {unknown}; allowed: {list(_allowed_keys(parent))}"
    if kind == "dataclass_type":
        if not loc:
            return f"interface must be a JSON object, got {type(got).__name__}"
        if loc[-1] == "schema":
            return f"{where} must be an object, got {type(got).__name__}"
        return f"{where} must be an object with 'tag' and 'text', got {type(got).__name__}"
    if kind in ("tuple_type", "list_type"):
        return f"{where} must be a list, got {type(got).__name__}"
    if kind == "too_long":
        ctx = first.get("ctx") or {}
        return f"{where} has {ctx.get('actual_length')} entries; the limit is {ctx.get('max_length')}"
    if kind == "bool_type":
        return f"{where} must be a boolean, got {type(got).__name__}"
    if kind in ("int_type", "greater_than_equal"):
        return f"{where} must be a non-negative integer, got {got!r}"
    if kind in ("string_type", "missing"):
        return f"{where} must be a non-empty string"
    if kind == "value_error":
        return f"{where} {(first.get('ctx') or {}).get('error', first['msg'])}"
    return f"{where}: {first['msg']}"


def _validate(adapter: TypeAdapter, obj: Any, prefix: tuple[Any, ...]) -> Any:
    try:
        return adapter.validate_python(obj)
    except ValidationError as exc:
        message = interface_error_message(exc, prefix)
        if exc.errors()[0]["type"] == "dataclass_type" and not exc.errors()[0]["loc"] and not prefix:
            raise InterfaceTypeError(message) from None
        raise InterfaceError(message) from None


def parse_omega(obj: Any) -> Interface:
    """Validate Ω (a JSON object or an ``Interface``) into an ``Interface``: the one rule set of both sides.

    Raises ``InterfaceError`` (a ``ValueError``) naming the offending field for unknown keys (top level,
    ``schema``, cues), non-boolean switches, a negative or non-integer ``version`` (``true`` is not 1), more
    than ``MAX_CUES`` cues, or a cue whose tag/text is empty, too long or multi-line; ``InterfaceTypeError``
    (also a ``TypeError``) when ``obj`` is not an object. ``null`` values count as missing keys.
    """
    if isinstance(obj, Interface):
        return obj
    if not isinstance(obj, Mapping):
        raise InterfaceTypeError(f"interface must be a JSON object, got {type(obj).__name__}")
    return _validate(_INTERFACE, dict(obj), ())


def parse_schema(obj: Any) -> SchemaSwitches:
    """Validate the ``schema`` part of Ω on its own (a mapping of the four switches, or None)."""
    if obj is None:
        return SchemaSwitches()
    if isinstance(obj, SchemaSwitches):
        return obj
    return _validate(_SCHEMA, dict(obj) if isinstance(obj, Mapping) else obj, ("schema",))


def parse_cue(obj: Any, index: int) -> Cue:
    """Validate one cue on its own (``index`` names it in the error message)."""
    if isinstance(obj, Cue):
        return obj
    return _validate(_CUE, dict(obj) if isinstance(obj, Mapping) else obj, ("cues", index))


# =====================================================================================================
# Requests
# =====================================================================================================

# The environment variable holding the service's bearer token: read by the service (``--token`` default) and by
# every client of the project (seal.rollout.client.EnvClient, hence both engines and the evaluation).
TOKEN_ENV = "SEAL_ENV_TOKEN"

Mode = Literal["train", "eval"]
EPISODE_ID_PATTERN = r"[A-Za-z0-9_.-]{1,128}"  # matched whole (fullmatch): `^...$` with match admits "id\n"
MAX_TASK_ID_CHARS = 200  # a task id longer than this is refused (422) wherever it is sent
ECHO_CHARS = 64  # an error message quotes at most this much of a client-sent id


class StepLimitSpec(_Request):
    """When the episode is cut off: after ``max_steps`` model messages per episode or per user turn."""

    scope: Literal["episode", "turn"] = "episode"
    max_steps: int = Field(20, ge=1, le=1000)


class CreateRequest(_Request):
    """``POST /episodes``.

    ``interface`` is Ω as sent; the service checks it against ``Interface`` (``parse_omega``) only after the
    mode check, so an evaluation request carrying any interface object that is not empty is refused with
    ``interface_in_eval`` whatever that object holds. ``episode_id`` is checked by the service too
    (``EPISODE_ID_PATTERN``, code ``invalid_episode_id``), so a bad id has its own code.
    """

    task_id: str = Field(max_length=MAX_TASK_ID_CHARS)
    mode: Mode = "train"
    interface: dict[str, Any] | None = None
    episode_id: str | None = None
    step_limit: StepLimitSpec | None = None
    # The rules profile of this episode (env_service.rules): the authors' training rules or BFCL's own.
    rules: Literal["release", "official"] | None = None  # None: release (eval mode: the service's --eval-rules)


class StepRequest(_Request):
    """``POST /episodes/{episode_id}/step``: the raw assistant text, tool calls as ``<tool_call>`` JSON."""

    content: str


# =====================================================================================================
# Replies
# =====================================================================================================


class HealthReply(_Reply):
    """``GET /healthz`` (never needs the token)."""

    status: str
    tasks: int


class TasksReply(_Reply):
    """``GET /tasks?split=train|eval|all``."""

    task_ids: list[str]


class ReplayReply(_Reply):
    """``GET /tasks/{task_id}/replay``: assistant messages that replay a training task's ground truth."""

    task_id: str
    ground_truth: list[str]  # one `<tool_call>` block per message, a plain reply ending each turn
    failing_twin: list[str] | None  # the same, its last calling turn answered by the plain reply alone; None:
    # no turn calls a tool


class StatsReply(_Reply):
    """``GET /stats``: counters for benchmarks and leak tests."""

    open_episodes: int
    expired_total: int
    created_total: int
    evaluated_total: int
    deleted_total: int
    rss_bytes: int  # the service and its worker processes
    split_sizes: dict[str, int]
    budget_refusals_total: int = 0  # actions over the cost budget (docs/env_service.md, "Cost limits")
    worker_restarts_total: int = 0  # worker processes killed for breaking the budget and rebuilt


class Message(_Reply):
    role: str
    content: str


class StepLimitInfo(_Reply):
    scope: Literal["episode", "turn"]
    max_steps: int


class CreateInfo(_Reply):
    category: str
    num_turns: int
    mode: Mode
    interface_version: int
    step_limit: StepLimitInfo
    rules: Literal["release", "official"] = "release"


class CreateReply(_Reply):
    """``POST /episodes`` (201): the first two messages [system, user] and the tool docs shown now."""

    episode_id: str
    messages: list[Message]
    tools: list[dict[str, Any]]  # BFCL tool docs (JSON-schema parameters), annotated by φ_schema in training
    info: CreateInfo

    @model_validator(mode="after")
    def _first_messages(self) -> CreateReply:
        if [m.role for m in self.messages] != ["system", "user"]:
            raise ValueError(f"messages must be [system, user], got {[m.role for m in self.messages]}")
        return self


class StepInfo(_Reply):
    error_type: Literal["parse_error", "unavailable_tool", "tool_error", "budget_exceeded"] | None
    # official rules add BFCL's endings: force_quit (the per-turn step bound) and inference_error (a reply
    # BFCL's handler cannot keep in its chat history makes its next model query fail)
    end_reason: Literal["completed", "step_limit", "budget_exceeded", "force_quit", "inference_error"] | None
    steps: int


class StepReply(_Reply):
    """``POST /episodes/{episode_id}/step``: the next user message, or null once the episode is done."""

    observation: Message | None
    done: bool
    turn: int
    info: StepInfo

    @model_validator(mode="after")
    def _observation_until_done(self) -> StepReply:
        # The agent loop stops at done; an episode that is not done always has a next message for the model.
        if self.observation is None and not self.done:
            raise ValueError("observation is null but the episode is not done")
        return self


class TurnDiagnosis(_Reply):
    index: int
    reached: bool
    tag: str
    label: str
    gt_calls: int
    model_calls: int
    parse_errors: int
    unavailable_calls: int
    tool_errors: int
    state_ok: bool | None
    response_ok: bool | None


class TurnCounts(_Reply):
    passed: int
    scorable: int
    passed_irrelevance: int
    irrelevance: int


class OfficialVerdict(_Reply):
    valid: bool
    error_type: str | None
    error_message: str | None
    consistent_with_turns: bool


class EvaluateReply(_Reply):
    """``POST /episodes/{episode_id}/evaluate``: BFCL's verdict and the per-turn diagnosis (docs/diagnosis.md)."""

    task_id: str
    category: str
    accuracy: float
    completed: bool
    num_turns: int
    turns_reached: int
    failure_tags: list[str]
    paper_labels: list[str]
    turns: list[TurnDiagnosis]
    counts: TurnCounts
    progress: float
    progress_with_irrelevance: float
    official: OfficialVerdict
    grade_ms: float
    end_reason: Literal[
        "completed", "step_limit", "evaluated_early", "budget_exceeded", "force_quit", "inference_error"
    ]
    steps: int


# Route -> (request model, reply model, success status); docs/protocol.md walks through the same table.
ROUTES: dict[str, tuple[type[BaseModel] | None, type[BaseModel] | None, int]] = {
    "GET /healthz": (None, HealthReply, 200),
    "GET /tasks": (None, TasksReply, 200),
    "GET /tasks/{task_id}/replay": (None, ReplayReply, 200),
    "GET /stats": (None, StatsReply, 200),
    "POST /episodes": (CreateRequest, CreateReply, 201),
    "POST /episodes/{episode_id}/step": (StepRequest, StepReply, 200),
    "POST /episodes/{episode_id}/evaluate": (None, EvaluateReply, 200),
    "DELETE /episodes/{episode_id}": (None, None, 204),
}

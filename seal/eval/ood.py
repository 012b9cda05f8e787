"""Out-of-distribution harnesses: BFCL V4 Memory and Web Search (agentic); τ²-bench is ``seal.eval.taubench``.

BFCL V4 agentic categories, played the way BFCL's own runner plays them (``bfcl_eval`` 2026.3.23:
``model_handler/base_handler.py``, ``utils.py``, ``eval_checker/eval_runner.py``), with our tool-call protocol:

- Entries come from ``bfcl_eval.utils.load_dataset_entry`` (ids, the agentic answer-format system prompt, tool
  docs with BFCL's "Python 3 syntax" hint, memory prerequisite chains), answers from
  ``data/possible_answer/BFCL_v4_{memory,web_search}.json``.
- Memory: per backend (``MemoryAPI_kv`` / ``MemoryAPI_rec_sum`` / ``MemoryAPI_vector``) and scenario, the
  prerequisite conversations run first, in order, each starting from the snapshot the previous one flushed
  (BFCL's own snapshot files, under ``<out>/memory_snapshots``); then every question starts from the final
  snapshot. The system prompt is BFCL's memory instruction (scenario setting + core memory content) before the
  agentic answer-format prompt, followed by the tool docs in Qwen2.5's function-calling layout (the layout the
  env service uses for training, ``env_service.prompts.system_prompt``), as Qwen's chat template places tools
  after a system message.
- A step: the reply is parsed by the env service's strict parser; a reply without calls, or one that does not
  parse, ends the turn (BFCL's FC runner: "Proceed to next turn"); calls execute on BFCL's classes through the env
  service's ``ToolExecutor`` (dispatch by validated name, BFCL's result text); more than 20 steps in a turn
  force-quits the conversation (BFCL's ``MAXIMUM_STEP_LIMIT``).
- ``memory_vector``'s embedding model and ``web_search``'s SerpAPI client come through
  ``seal.eval.bfcl_v4_backends`` (checked local weights; a base URL and a bound on BFCL's 429 retries).
- Grading: BFCL's ``agentic_checker`` on the last reply of the question that is not a tool call (no such reply:
  invalid, as BFCL's ``agentic:no_last_message``). Memory accuracy = unweighted mean over backends, Web Search =
  mean of ``web_search_base`` and ``web_search_no_snippet`` (BFCL's summary).

Self-checks: the memory category's ground truth is a list of acceptable answer strings, not tool calls, so it
cannot be replayed. ``ground_truth`` is instead an *oracle memory writer*: in the first prerequisite
conversation of each scenario it stores every question's answer with the backend's own write tool; at question
time it reads it back with the backend's read tool and answers in BFCL's format. That passes only if the tools
execute, the snapshot chain carries memory across conversations into the questions, and the checker accepts
the answer. ``empty`` always replies with plain text and must score 0.
"""

from __future__ import annotations

import asyncio
import json
import re
import shutil
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from env_service.parser import format_tool_call
from seal.eval.bfcl_v4_backends import (
    SERPAPI_MAX_ATTEMPTS,
    SERPAPI_URL,
    OodUnavailable,
    SerpApiStopped,
    bounded_serpapi,
    check_vector_backend,
    check_web_search,
    load_vector_backend,
    minilm_dir,
    minilm_provenance,
)
from seal.eval.egress import PUBLIC_ONLY, EgressRule
from seal.eval.policies import EMPTY_REPLY, Agent, Message, Policy, PolicyError, PolicyOptions, parse_policy
from seal.eval.results import ood_summary, write_eval_dir
from seal.redact import scrub

BENCHMARKS = ("bfcl_v4_memory", "bfcl_v4_web_search")  # τ²-bench: seal.eval.taubench (its own environment)
MEMORY_BACKENDS = ("kv", "rec_sum", "vector")
WEB_SEARCH_CATEGORIES = ("web_search_base", "web_search_no_snippet")
MAXIMUM_STEP_LIMIT = 20  # bfcl_eval.constants.default_prompts.MAXIMUM_STEP_LIMIT (checked in tests)


# --- entries -----------------------------------------------------------------------------------------


@dataclass
class AgenticEntry:
    """One BFCL V4 agentic conversation (a memory prerequisite, a memory question or a web-search question)."""

    id: str  # BFCL's id, e.g. memory_kv_3-customer-3, memory_kv_prereq_0-customer-0, web_search_base_7
    bfcl_category: str  # memory_kv | memory_rec_sum | memory_vector | web_search_base | web_search_no_snippet
    key: str  # OOD summary key: "memory" | "web_search"
    turns: list[list[Message]]  # BFCL's question: per turn, its messages
    tools: list[dict]
    class_name: str
    initial_config: dict
    scenario: str | None = None
    answers: list[str] | None = None  # acceptable answers; None for a prerequisite conversation

    @property
    def is_prereq(self) -> bool:
        return "prereq" in self.id

    @property
    def number(self) -> str:
        """The entry's index in BFCL's file (``memory_kv_12-student-12`` -> ``12``)."""
        return self.id.split("-", 1)[0].rsplit("_", 1)[1]


def _bfcl() -> Any:
    import importlib

    importlib.import_module("env_service.bfcl")  # sets BFCL_PROJECT_ROOT before bfcl_eval is imported
    return importlib.import_module("bfcl_eval.utils")


def _answers(file_name: str, rename: Callable[[str], str]) -> dict[str, list[str]]:
    from env_service.bfcl import ANSWER_DIR

    out = {}
    with open(ANSWER_DIR / file_name, encoding="utf-8") as handle:
        for line in handle:
            if line.strip():
                row = json.loads(line)
                out[rename(row["id"])] = [str(a) for a in row["ground_truth"]]
    return out


def memory_entries(backend: str, snapshot_root: Path) -> list[AgenticEntry]:
    """Prerequisite conversations and questions of one memory backend, in BFCL's order."""
    if backend not in MEMORY_BACKENDS:
        raise ValueError(f"unknown memory backend {backend!r}; expected one of {MEMORY_BACKENDS}")
    utils = _bfcl()
    category = f"memory_{backend}"
    raw = utils.load_dataset_entry(category)
    raw = utils.populate_initial_settings_for_memory_test_cases(raw, snapshot_root)
    answers = _answers("BFCL_v4_memory.json", lambda i: i.replace("memory", category))
    entries = []
    for row in raw:
        entry = AgenticEntry(row["id"], category, "memory", row["question"], row["function"],
                             row["involved_classes"][0], row["initial_config"], row["scenario"])
        if not entry.is_prereq:
            if entry.id not in answers:
                raise ValueError(f"no answer for {entry.id} in BFCL_v4_memory.json")
            entry.answers = answers[entry.id]
        entries.append(entry)
    return entries


def web_search_entries(category: str) -> list[AgenticEntry]:
    if category not in WEB_SEARCH_CATEGORIES:
        raise ValueError(f"unknown web search category {category!r}")
    utils = _bfcl()
    raw = utils.populate_initial_settings_for_web_search_test_cases(utils.load_dataset_entry(category))
    answers = _answers("BFCL_v4_web_search.json", lambda i: i.replace("web_search", category))
    return [AgenticEntry(row["id"], category, "web_search", row["question"], row["function"],
                         row["involved_classes"][0], row["initial_config"], answers=answers[row["id"]])
            for row in raw]


# --- prompts -----------------------------------------------------------------------------------------


def memory_system_text(entry: AgenticEntry, instance: Any) -> str:
    """BFCL's memory instruction (``model_handler.utils.add_memory_instruction_system_prompt``) for `instance`."""
    from bfcl_eval.constants.default_prompts import (
        MEMORY_AGENT_SETTINGS,
        MEMORY_BACKEND_INSTRUCTION_CORE_ARCHIVAL,
        MEMORY_BACKEND_INSTRUCTION_UNIFIED,
    )

    template = (MEMORY_BACKEND_INSTRUCTION_UNIFIED if "rec_sum" in entry.bfcl_category
                else MEMORY_BACKEND_INSTRUCTION_CORE_ARCHIVAL)
    return template.format(scenario_setting=MEMORY_AGENT_SETTINGS[entry.scenario],
                           memory_content=instance._dump_core_memory_to_context())


def first_messages(entry: AgenticEntry, instance: Any) -> list[Message]:
    """The conversation's opening: one system message (instructions + tool docs) and the first user turn."""
    from env_service.prompts import system_prompt

    turn = [dict(m) for m in entry.turns[0]]
    system_parts = []
    if entry.key == "memory":
        system_parts.append(memory_system_text(entry, instance))
    if turn and turn[0]["role"] == "system":
        system_parts.append(turn.pop(0)["content"])
    # BFCL joins a memory instruction and an existing system prompt with a blank line; Qwen's chat template puts
    # the tools section after the system text, separated by a blank line.
    system = "\n\n".join([*system_parts, system_prompt(entry.tools)]) if system_parts else system_prompt(entry.tools)
    return [{"role": "system", "content": system}, *turn]


# --- playing -----------------------------------------------------------------------------------------


@dataclass
class Conversation:
    """A played conversation: messages, the replies per turn, and how it ended."""

    entry: AgenticEntry
    messages: list[Message] = field(default_factory=list)
    replies: list[list[str]] = field(default_factory=list)  # per turn, every model reply
    num_model_calls: int = 0
    force_quit: bool = False
    error: str | None = None


def make_executor(entry: AgenticEntry) -> Any:
    """BFCL's class for `entry`, loaded as BFCL loads it (memory: from the snapshot chain)."""
    from env_service.executor import ToolExecutor

    if entry.class_name == "MemoryAPI_vector":
        load_vector_backend()  # BFCL's module, its encoder from the checked local weights (never the Hub)
    try:
        return ToolExecutor([entry.class_name], entry.initial_config, long_context=False)
    except (ImportError, OSError) as exc:  # a missing package, or model weights BFCL loads at import time
        raise OodUnavailable(f"{entry.class_name} cannot be imported: {exc}") from exc


def _execute(executor: Any, calls: list[dict[str, Any]]) -> str:
    from env_service.prompts import tool_response
    from env_service.tool_errors import ERROR_PREFIX

    parts = []
    for call in calls:
        name = call["name"]
        if executor.knows(name):
            result = executor.call(name, call["arguments"])
        else:  # BFCL evaluates the call string, where an unknown name is a NameError
            result = f"{ERROR_PREFIX}name '{name}' is not defined"
        parts.append(tool_response(result))
    # A tool's text goes to the policy (maybe a remote server) and into results.jsonl: no secret's value in it.
    return scrub("".join(parts))


async def play(entry: AgenticEntry, agent: Agent, executor: Any) -> Conversation:
    """Play `entry` turn by turn with BFCL's FC-runner rules (module docstring); flush memory after a prereq."""
    from env_service.parser import parse_tool_calls

    conv = Conversation(entry)
    instance = next(iter(executor.instances.values()))
    for index, turn in enumerate(entry.turns):
        if index == 0:
            conv.messages = first_messages(entry, instance)
        else:
            conv.messages += [dict(m) for m in turn]
        replies: list[str] = []
        conv.replies.append(replies)
        steps = 0
        while True:
            reply = await agent(list(conv.messages))
            if not isinstance(reply, str):
                raise PolicyError(f"policy returned {type(reply).__name__}, not text")
            conv.num_model_calls += 1
            replies.append(reply)
            conv.messages.append({"role": "assistant", "content": reply})
            parsed = parse_tool_calls(reply)
            if parsed.error or not parsed.calls:
                break
            conv.messages.append({"role": "user", "content": _execute(executor, parsed.calls)})
            steps += 1
            if steps > MAXIMUM_STEP_LIMIT:
                conv.force_quit = True
                break
        if conv.force_quit:
            break
    if entry.is_prereq:
        instance._flush_memory_to_local_file()
    return conv


def final_answer(conv: Conversation) -> str | None:
    """The last reply of the (single-turn) question that is not a tool call (BFCL's evaluation rule)."""
    from env_service.parser import parse_tool_calls

    last = None
    for reply in conv.replies[0] if conv.replies else []:
        parsed = parse_tool_calls(reply)
        if parsed.error or not parsed.calls:
            last = reply
    return last


def grade(conv: Conversation) -> dict[str, Any]:
    """BFCL's agentic verdict for a played question: ``{"valid", "error_type", ...}``."""
    from bfcl_eval.eval_checker.agentic_eval.agentic_checker import agentic_checker

    if conv.error is not None:
        return {"valid": False, "error_type": "agentic:inference_error", "error_message": conv.error}
    answer = final_answer(conv)
    if answer is None:
        return {"valid": False, "error_type": "agentic:no_last_message",
                "error_message": "Cannot find the last chat message that is not a function call."}
    result = agentic_checker(answer, conv.entry.answers or [])
    return {"valid": bool(result.get("valid")), "error_type": result.get("error_type"),
            "error_message": result.get("error_message")}


def result_record(conv: Conversation) -> dict[str, Any]:
    """A ``results.jsonl`` line (docs/run_directory.md, OOD extension): `category` is the OOD key."""
    verdict = grade(conv)
    return {
        "task_id": conv.entry.id,
        "category": conv.entry.key,
        "bfcl_category": conv.entry.bfcl_category,
        "scenario": conv.entry.scenario,
        "accuracy": int(verdict["valid"]),
        "progress": None,
        "failure_tags": [],
        "paper_labels": [],
        "num_model_calls": conv.num_model_calls,
        "force_quit": conv.force_quit,
        "final_answer": final_answer(conv) if conv.error is None else None,
        "possible_answers": conv.entry.answers,
        "verdict": verdict,
        "messages": conv.messages,
        "error": conv.error,
    }


# --- self-check agents -------------------------------------------------------------------------------

# Per memory backend: how the oracle stores an answer, and how it reads it back.
_ORACLE_WRITE: dict[str, Callable[[str, str], tuple[str, dict]]] = {
    "memory_kv": lambda n, a: ("archival_memory_add", {"key": f"answer_{n}", "value": a}),
    "memory_rec_sum": lambda n, a: ("memory_append", {"text": f"answer_{n}: {a}\n"}),
    "memory_vector": lambda n, a: ("archival_memory_add", {"text": f"answer_{n}: {a}"}),
}
# The vector read is a similarity search for the stored text itself, top 1: it passes only if the embeddings
# rebuilt from each snapshot still map every id to its own text.
_ORACLE_READ: dict[str, Callable[[str, str], tuple[str, dict]]] = {
    "memory_kv": lambda n, a: ("archival_memory_retrieve", {"key": f"answer_{n}"}),
    "memory_rec_sum": lambda n, a: ("memory_retrieve", {}),
    "memory_vector": lambda n, a: ("archival_memory_retrieve", {"query": f"answer_{n}: {a}", "top_k": 1}),
}
_TOOL_RESPONSE = re.compile(r"<tool_response>\n(.*?)\n</tool_response>", re.DOTALL)


def _recall(observation: str, number: str, category: str) -> str | None:
    """The answer the oracle stored for question `number`, found in a read tool's response text."""
    match = _TOOL_RESPONSE.search(observation)
    if not match:
        return None
    body = match.group(1)
    try:  # dict results come back as JSON; others (lists) as Python's str(), searched as they are
        decoded = json.loads(body)
    except ValueError:
        decoded = None
    if category == "memory_kv":
        value = decoded.get("value") if isinstance(decoded, dict) else None
        return value if isinstance(value, str) else None
    if decoded is not None:
        body = "\n".join(_strings(decoded))
    found = re.search(rf"(?:^|\W)answer_{number}: ([^\n'\"]*)", body)
    return found.group(1).strip() if found else None


def _strings(value: Any) -> list[str]:
    """Every string inside a decoded tool result (vector results nest them: ``{"result": [{"text": ...}]}``)."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        value = list(value.values())
    if isinstance(value, list):
        return [s for item in value for s in _strings(item)]
    return []


def oracle_agent(entry: AgenticEntry, scenario_answers: dict[str, str]) -> Agent:
    """The `ground_truth` self-check for one memory conversation (module docstring).

    `scenario_answers`: question number -> first acceptable answer, for the entry's scenario."""
    category = entry.bfcl_category
    first_prereq = entry.is_prereq and entry.id.endswith("-0")
    state = {"wrote": False, "asked": False}

    async def agent(messages: list[Message]) -> str:
        if entry.is_prereq:
            if first_prereq and not state["wrote"]:
                state["wrote"] = True
                calls = [_ORACLE_WRITE[category](n, a) for n, a in sorted(scenario_answers.items())]
                return "\n".join(format_tool_call(name, args) for name, args in calls)
            return "Noted."
        if not state["asked"]:
            state["asked"] = True
            name, args = _ORACLE_READ[category](entry.number, scenario_answers.get(entry.number, ""))
            return format_tool_call(name, args)
        recalled = _recall(messages[-1]["content"], entry.number, category) if messages else None
        answer = recalled if recalled is not None else "I do not know"
        return str({"answer": answer, "context": "retrieved from memory"})

    return agent


def answer_agent(entry: AgenticEntry) -> Agent:
    """The `ground_truth` self-check for web search: answers with the first acceptable answer (checks the
    harness and checker only; the search itself needs the network)."""

    async def agent(messages: list[Message]) -> str:
        return str({"answer": (entry.answers or [""])[0], "context": "ground truth"})

    return agent


def agent_for(policy: Policy, entry: AgenticEntry, answers_by_scenario: dict[str, dict[str, str]]) -> Agent:
    if policy.spec == "ground_truth":
        if entry.key == "memory":
            return oracle_agent(entry, answers_by_scenario.get(entry.scenario or "", {}))
        return answer_agent(entry)
    if policy.spec == "empty":
        async def empty(messages: list[Message]) -> str:
            return EMPTY_REPLY

        return empty
    return policy.agent(entry.id)


# --- running a benchmark -----------------------------------------------------------------------------


async def _run_entries(entries: Sequence[AgenticEntry], policy: Policy, concurrency: int, progress: bool,
                       executor_factory: Callable[[AgenticEntry], Any],
                       close_policy: bool = False) -> tuple[list[dict], list[dict]]:
    """Play every chain (prerequisites in order, then questions concurrently); returns (results, prereqs).

    `close_policy`: close the policy's clients in this event loop when done (they are bound to it)."""
    from tqdm import tqdm

    answers_by_scenario: dict[str, dict[str, str]] = {}
    for entry in entries:
        if entry.answers and entry.scenario:
            answers_by_scenario.setdefault(entry.scenario, {})[entry.number] = entry.answers[0]
    chains: dict[tuple[str, str | None], list[AgenticEntry]] = {}
    for entry in entries:
        if entry.is_prereq:
            chains.setdefault((entry.bfcl_category, entry.scenario), []).append(entry)
    gate = asyncio.Semaphore(concurrency)
    questions = [e for e in entries if not e.is_prereq]
    bar = tqdm(total=len(entries), desc=f"ood {policy.spec}", unit="conv", disable=not progress,
               dynamic_ncols=True, mininterval=0.5)
    results: dict[str, dict] = {}
    prereqs: list[dict] = []

    async def one(entry: AgenticEntry) -> Conversation:
        conv = Conversation(entry)
        try:
            executor = executor_factory(entry)
            conv = await play(entry, agent_for(policy, entry, answers_by_scenario), executor)
        except PolicyError as exc:
            conv.error = f"{type(exc).__name__}: {exc}"
        bar.update(1)
        return conv

    async def chain(key: tuple[str, str | None]) -> None:
        for entry in chains.get(key, []):
            async with gate:
                conv = await one(entry)
            prereqs.append({"task_id": entry.id, "messages": conv.messages, "error": conv.error,
                            "num_model_calls": conv.num_model_calls, "force_quit": conv.force_quit})

        async def ask(entry: AgenticEntry) -> None:
            async with gate:
                results[entry.id] = result_record(await one(entry))

        await asyncio.gather(*(ask(e) for e in questions if (e.bfcl_category, e.scenario) == key))

    try:
        await asyncio.gather(*(chain(key) for key in {(e.bfcl_category, e.scenario) for e in questions}))
    finally:
        bar.close()
        if close_policy:
            await policy.aclose()
    return [results[e.id] for e in questions], prereqs


def _select(entries: list[AgenticEntry], tasks: Sequence[str] | None) -> list[AgenticEntry]:
    """All entries, or the chosen questions (by BFCL id) with every prerequisite of their chains."""
    if not tasks:
        return entries
    wanted = set(tasks)
    chosen = [e for e in entries if e.id in wanted and not e.is_prereq]
    missing = wanted - {e.id for e in chosen}
    if missing:
        raise ValueError(f"unknown question ids: {sorted(missing)[:5]}")
    keys = {(e.bfcl_category, e.scenario) for e in chosen}
    return [e for e in entries if (e.is_prereq and (e.bfcl_category, e.scenario) in keys) or e.id in wanted]


def _missing(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is None


def run_bfcl_v4_memory(policy: Policy, out: Path, backends: Sequence[str] = MEMORY_BACKENDS,
                       tasks: Sequence[str] | None = None, concurrency: int = 16, progress: bool = True,
                       executor_factory: Callable[[AgenticEntry], Any] = make_executor,
                       close_policy: bool = False) -> dict:
    """BFCL V4 memory for `backends`; writes an OOD evaluation directory (key ``memory``) and returns its summary."""
    backends = list(dict.fromkeys(backends))
    unknown = [b for b in backends if b not in MEMORY_BACKENDS]
    if unknown or not backends:
        raise ValueError(f"memory backends must be some of {MEMORY_BACKENDS}, got {backends}")
    if "vector" in backends:
        load_vector_backend()  # checks packages and weights before any conversation runs
    if "kv" in backends and _missing("rank_bm25"):
        raise OodUnavailable("memory backend 'kv' needs rank-bm25 (pip install rank-bm25)")
    snapshots = out / "memory_snapshots"
    shutil.rmtree(snapshots, ignore_errors=True)  # BFCL's chain reads the latest snapshot: start clean
    snapshots.mkdir(parents=True)
    entries: list[AgenticEntry] = []
    for backend in backends:
        entries += memory_entries(backend, snapshots)
    entries = _select(entries, tasks)
    started = time.perf_counter()
    records, prereqs = asyncio.run(_run_entries(entries, policy, concurrency, progress, executor_factory,
                                                close_policy))
    wall_s = time.perf_counter() - started
    notes = [*_policy_notes(policy, "memory"), f"BFCL V4 memory backends run: {', '.join(backends)}"]
    if "vector" in backends:
        notes.append(minilm_provenance())
    if set(backends) != set(MEMORY_BACKENDS):
        notes.append("BFCL's Memory score is the unweighted mean of kv, vector and rec_sum; this directory's "
                     f"'memory' is the mean of {', '.join(backends)} only (see 'breakdown')")
    notes += _self_check_notes(policy, records)
    summary = ood_summary(records, "bfcl_v4", policy.spec, wall_s, notes)
    write_eval_dir(out, records, summary, {"prereq_conversations.jsonl": prereqs} if prereqs else None)
    return summary


def run_bfcl_v4_web_search(policy: Policy, out: Path, tasks: Sequence[str] | None = None, concurrency: int = 16,
                           progress: bool = True, executor_factory: Callable[[AgenticEntry], Any] | None = None,
                           categories: Sequence[str] = WEB_SEARCH_CATEGORIES, close_policy: bool = False,
                           serpapi_url: str = SERPAPI_URL, max_attempts: int = SERPAPI_MAX_ATTEMPTS,
                           egress: EgressRule | None = PUBLIC_ONLY) -> dict:
    """BFCL V4 web search through BFCL's WebSearchAPI, SerpAPI at `serpapi_url` with at most `max_attempts`
    tries per search (``seal.eval.bfcl_v4_backends``), unless `executor_factory` supplies a search backend.
    Pages are fetched under `egress` (``seal.eval.egress``; None: BFCL's own unchecked fetch)."""
    entries: list[AgenticEntry] = []
    for category in categories:
        entries += web_search_entries(category)
    entries = _select(entries, tasks)
    notes = [*_policy_notes(policy, "web_search"), f"BFCL V4 web search categories run: {', '.join(categories)}"]
    started = time.perf_counter()
    if executor_factory is None:
        check_web_search()
        notes.append(f"search backend: BFCL's WebSearchAPI through SerpAPI at {serpapi_url}, at most "
                     f"{max_attempts} attempts per search on HTTP 429")
        notes.append("fetch_url_content: public addresses only (the egress rule)" if egress is not None else
                     "fetch_url_content: BFCL's own fetch, internal addresses allowed (--allow-internal-fetch)")
        try:
            with bounded_serpapi(serpapi_url, max_attempts, egress):
                records, _ = asyncio.run(_run_entries(entries, policy, concurrency, progress, make_executor,
                                                      close_policy))
        except SerpApiStopped as exc:
            raise OodUnavailable(f"bfcl_v4_web_search stopped, nothing written: {exc}") from None
    else:
        records, _ = asyncio.run(_run_entries(entries, policy, concurrency, progress, executor_factory,
                                              close_policy))
    wall_s = time.perf_counter() - started
    notes += _self_check_notes(policy, records)
    summary = ood_summary(records, "bfcl_v4", policy.spec, wall_s, notes)
    write_eval_dir(out, records, summary)
    return summary


def run_benchmark(benchmark: str, policy_spec: str, out: Path, *, options: PolicyOptions | None = None,
                  tasks: Sequence[str] | None = None, concurrency: int = 16, progress: bool = True,
                  memory_backends: Sequence[str] = MEMORY_BACKENDS, allow_internal_fetch: bool = False) -> dict:
    """``python -m seal.evaluate --benchmark NAME``: run one OOD benchmark and write its directory.
    `allow_internal_fetch`: web search fetches internal addresses too (``seal.eval.egress``; closed networks)."""
    if benchmark not in BENCHMARKS:
        raise ValueError(f"unknown benchmark {benchmark!r}; expected one of {BENCHMARKS}")
    if benchmark == "bfcl_v4_memory" and "vector" in memory_backends:
        check_vector_backend()  # packages and weights checked before a policy model is loaded
        minilm_dir()
    if benchmark == "bfcl_v4_web_search":
        check_web_search()
    policy = parse_policy(policy_spec, options)
    if benchmark == "bfcl_v4_memory":
        return run_bfcl_v4_memory(policy, out, memory_backends, tasks, concurrency, progress, close_policy=True)
    return run_bfcl_v4_web_search(policy, out, tasks, concurrency, progress, close_policy=True,
                                  egress=None if allow_internal_fetch else PUBLIC_ONLY)


def _policy_notes(policy: Policy, key: str) -> list[str]:
    if policy.spec == "ground_truth" and key == "memory":
        return ["ground_truth: oracle memory writer (the memory ground truth is answer strings, not calls): the first "
                "prerequisite conversation of each scenario stores every answer with the backend's write tool, each "
                "question reads it back with the read tool and answers in BFCL's format"]
    if policy.spec == "ground_truth":
        return ["ground_truth: answers with the first acceptable answer without searching (checks the harness and "
                "BFCL's checker, not the search backend)"]
    if policy.spec == "empty":
        return [f"empty: harness self-check replying {EMPTY_REPLY!r} to everything"]
    return list(policy.notes)


def _self_check_notes(policy: Policy, records: Sequence[dict]) -> list[str]:
    if not policy.is_self_check:
        return []
    expected = 1 if policy.spec == "ground_truth" else 0
    wrong = [r["task_id"] for r in records if r["accuracy"] != expected]
    if not wrong:
        return [f"{policy.spec} self-check: every question scored {expected} as expected"]
    return [f"{policy.spec} self-check: {len(wrong)} question(s) did not score {expected}: {', '.join(wrong[:10])}"]

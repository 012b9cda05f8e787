"""``seal-eval`` (``python -m seal.evaluate``): evaluate any policy on BFCL V3 multi-turn (held-in) or an OOD benchmark.

Held-in (default): the 400 eval tasks, raw interface (mode ``eval``), greedy decoding, concurrent episodes
against the env service (started here when ``--env-url`` is not given, and stopped afterwards). Writes an
evaluation directory (``docs/run_directory.md``: ``results.jsonl`` + ``summary.json``) and prints the paper's
row (Average, Base, Miss Func, Miss Param, Long Context) with binomial standard errors.

Every policy plays through the one episode driver (``seal.rollout.episode.play_episode``), the code that plays
training episodes, with its restart policy: token-level policies (``hf:``, ``vllm:``) token-exact, text-level
ones (``openai:``, the ``ground_truth`` / ``empty`` self-checks) on text (``seal.eval.policies.TextTurns``).
Records and summaries follow ``seal.eval.results``. ``--run runs/<exp>`` evaluates a run's last and best
checkpoints; ``--benchmark`` runs an OOD harness (``seal.eval.ood``). ``seal-eval tau2 ...`` runs τ²-bench, a command
with options of its own (``seal-eval tau2 --help``; ``seal.eval.taubench``). Usage: ``docs/evaluation.md``.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from env_service.protocol import TOKEN_ENV
from env_service.rules import DEFAULT_RULES, OFFICIAL, RULES
from seal.eval.held_in import EvalRequest, EvaluationInterrupted, evaluate
from seal.eval.notes import print_summary
from seal.eval.policies import PolicyError, PolicyOptions
from seal.eval.results import claim_output_dir, default_eval_name
from seal.eval.run_checkpoints import evaluate_run
from seal.eval.service import RELEASE_MAX_STEPS, ServiceSettings
from seal.eval.taubench import harness as tau2
from seal.io_utils import input_path
from seal.redact import guard_output
from seal.rollout.client import token_route_refusal


def build_parser() -> tuple[argparse.ArgumentParser, argparse.ArgumentParser]:
    """``seal-eval``'s parser (held-in and ``--benchmark`` options) and that of its ``tau2`` command."""
    p = argparse.ArgumentParser(prog="seal-eval", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = p.add_subparsers(dest="command", title="commands", metavar="{tau2}",
                                description="without one: BFCL V3 multi-turn (the options below) or --benchmark")
    tau2_parser = commands.add_parser("tau2", help="τ²-bench through the real τ² package, in its own environment "
                                      "(seal-eval tau2 --help)", description=tau2.__doc__,
                                      formatter_class=argparse.RawDescriptionHelpFormatter)
    tau2.add_arguments(tau2_parser)
    p.add_argument("--policy", help="hf:<path> | vllm:<path> | openai:<base_url>#<model> | ground_truth | empty; "
                   "<path> is a model directory (from the cwd when it exists there, else from the project) or a "
                   "built-in model, e.g. hf:builtin:smollm2")
    p.add_argument("--run", type=Path, help="a run directory: evaluate its last and best checkpoints (into "
                   "<run>/eval/last and <run>/eval/best; with --tasks, another --split or --rules "
                   "<run>/eval/<last|best>_<split or task subset>[_<rules>]); --resume and --overwrite as for --policy")
    p.add_argument("--backend", choices=["hf", "vllm"], default="hf", help="model backend for --run (default hf)")
    p.add_argument("--benchmark", help="an OOD benchmark instead of BFCL V3: bfcl_v4_memory, bfcl_v4_web_search "
                   "(τ²-bench is the command `seal-eval tau2`)")
    p.add_argument("--memory-backends", default="kv,rec_sum,vector",
                   help="bfcl_v4_memory backends to run (default all three: BFCL's Memory is their mean)")
    p.add_argument("--allow-internal-fetch", action="store_true", help="bfcl_v4_web_search: let the model's "
                   "fetch_url_content reach loopback, private and link-local addresses (research on a closed "
                   "network only; docs/evaluation.md)")
    p.add_argument("--rules", choices=list(RULES), default=DEFAULT_RULES,
                   help="rules profile of every episode: official = BFCL's own multi-turn pipeline (the number to "
                   "compare with the leaderboard and BFCL-CLI papers); release = the authors' training "
                   "environment (default; what training validation reports)")
    p.add_argument("--resume", action="store_true", help="keep the finished tasks already in --out (an "
                   "interrupted evaluation) and play only the rest")
    p.add_argument("--overwrite", action="store_true", help="replace the evaluation already in --out (a non-empty "
                   "--out is refused otherwise)")
    p.add_argument("--split", choices=["eval", "train", "all"], default="eval",
                   help="eval: the 400 held-in tasks (paper, training validation); all: the 800 multi-turn "
                   "tasks (the leaderboard's set); train: the 400 training tasks")
    p.add_argument("--tasks", help="comma-separated task ids (overrides --split)")
    p.add_argument("--out", type=Path, help="evaluation directory (default evals/<policy>_<split or task subset>"
                   "[_<rules>]; refused when not empty unless --resume or --overwrite)")
    p.add_argument("--env-url", help="use this env service instead of starting one")
    p.add_argument("--allow-token-over-http", action="store_true", help="send $SEAL_ENV_TOKEN to an --env-url "
                   "over plain http:// off loopback (in clear: only where the network path is yours)")
    p.add_argument("--concurrency", type=int, default=32, help="episodes in flight (default 32)")
    p.add_argument("--official-availability", action="store_true",
                   help="started service: held-out miss_func tools callable before their reveal (official BFCL)")
    p.add_argument("--step-limit-scope", choices=["episode", "turn"], default=None,
                   help="started service: step limit per episode (release) or per turn (official BFCL)")
    p.add_argument("--max-steps", type=int, default=None, help=f"started service: step limit (release "
                   f"{RELEASE_MAX_STEPS}; ground_truth defaults to what its longest replay needs)")
    p.add_argument("--max-tokens-per-call", type=int, default=4096, help="tokens per model call (release 4096)")
    p.add_argument("--max-model-len", type=int, default=None, help="hf/vllm: context window (default: the "
                   "release's 16384, capped at the model's own max_position_embeddings; more than that is refused)")
    p.add_argument("--call-deadline", type=float, default=900.0, help="openai: seconds one model call may take, "
                   "retries included (default 900); a one-slot server (llama.cpp's default) queues concurrent "
                   "calls: give --concurrency 1, or a deadline that covers the queue")
    p.add_argument("--api-key-env", default=None, metavar="VAR", help="openai: send the value of environment "
                   "variable VAR as the bearer key (default: no key; OPENAI_API_KEY is never sent unless named here)")
    p.add_argument("--allow-key-over-http", action="store_true", help="openai: allow sending the key over plain "
                   "http:// to a host that is not loopback (refused by default: anyone on the path reads it)")
    p.add_argument("--device", default=None, help="hf: torch device (default cuda if available, else cpu)")
    p.add_argument("--dtype", default="auto", help="hf and vllm: model dtype (auto: the backend's default; bfloat16, "
                   "float32, ...)")
    p.add_argument("--hf-batch-size", type=int, default=32, help="hf: model calls of concurrent episodes "
                   "generated together (default 32; 1 = one at a time, bit-for-bit independent of concurrency)")
    p.add_argument("--tensor-parallel-size", type=int, default=1, help="vllm: tensor parallel size")
    p.add_argument("--gpu-memory-utilization", type=float, default=0.85, help="vllm: GPU memory fraction")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--log-level", default="warning")
    return p, tau2_parser


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p, tau2_parser = build_parser()
    args = p.parse_args(argv)
    if args.command == "tau2":
        tau2.check_arguments(args, tau2_parser)
        return args
    if args.benchmark and args.benchmark.startswith("tau2"):
        p.error("τ²-bench is a command of its own: seal-eval tau2 --domain ... --policy ... (seal-eval tau2 --help)")
    if bool(args.policy) == bool(args.run):
        p.error("give exactly one of --policy and --run")
    if args.run and args.benchmark:
        p.error("--run evaluates held-in; for OOD pass --policy hf:<checkpoint> --benchmark ...")
    if args.concurrency <= 0:
        p.error("--concurrency must be positive")
    if args.hf_batch_size <= 0:
        p.error("--hf-batch-size must be positive")
    if args.call_deadline <= 0 or (args.max_model_len is not None and args.max_model_len <= 0):
        p.error("--call-deadline and --max-model-len must be positive")
    if args.rules == OFFICIAL and (args.official_availability or args.step_limit_scope or args.max_steps):
        p.error("--rules official sets BFCL's own step and availability rules; --official-availability, "
                "--step-limit-scope and --max-steps tune the release profile only")
    if args.run and args.out:
        p.error("--run writes into the run directory, <run>/eval/<last|best>[_<split or task subset>]; drop --out "
                "(or evaluate one checkpoint with --policy hf:<run>/checkpoints/step_N --out ...)")
    return args


def _service_settings(args: argparse.Namespace) -> ServiceSettings | None:
    if args.step_limit_scope is None and args.max_steps is None and not args.official_availability:
        return None  # defaults (release), or the ground-truth budget
    return ServiceSettings(strict_availability=not args.official_availability,
                           step_limit_scope=args.step_limit_scope or "episode",
                           max_steps=args.max_steps or RELEASE_MAX_STEPS)


def _default_out(args: argparse.Namespace, tasks: Sequence[str] | None) -> Path:
    return Path("evals") / default_eval_name(args.policy or "run", args.split, tasks, args.rules, args.benchmark,
                                             default_rules=DEFAULT_RULES)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.command == "tau2":  # τ² runs in its own environment, with options of its own
        return tau2.main(args)
    logging.basicConfig(level=args.log_level.upper(), format="%(levelname)s %(name)s: %(message)s")
    guard_output()  # no secret's value in what this command prints or logs
    options = PolicyOptions(max_tokens_per_call=args.max_tokens_per_call, max_model_len=args.max_model_len,
                            device=args.device, dtype=args.dtype, tensor_parallel_size=args.tensor_parallel_size,
                            gpu_memory_utilization=args.gpu_memory_utilization, hf_batch_size=args.hf_batch_size,
                            call_deadline=args.call_deadline, api_key_env=args.api_key_env,
                            key_over_http=args.allow_key_over_http)
    tasks = [t.strip() for t in args.tasks.split(",") if t.strip()] if args.tasks else None
    try:
        if args.benchmark:
            from seal.eval import ood

            out = args.out or _default_out(args, tasks)
            claim_output_dir(out, overwrite=args.overwrite)
            try:
                summary = ood.run_benchmark(args.benchmark, args.policy, out, options=options, tasks=tasks,
                                            concurrency=args.concurrency, progress=not args.no_progress,
                                            memory_backends=[b.strip() for b in args.memory_backends.split(",")],
                                            allow_internal_fetch=args.allow_internal_fetch)
            except ood.OodUnavailable as exc:
                print(f"error: {exc}", file=sys.stderr)
                return 3
            print_summary(summary, out)
            return 1 if _errored(summary) else 0
        refused = args.env_url and token_route_refusal(
            [args.env_url], TOKEN_ENV, token_env_from_command_line=True, urls_from_command_line=True,
            allow_http=args.allow_token_over_http)
        if refused:
            raise ValueError(refused)
        base = EvalRequest(policy=args.policy or "", out=args.out or _default_out(args, tasks), split=args.split,
                           tasks=tasks, env_url=args.env_url, concurrency=args.concurrency,
                           service=_service_settings(args), options=options, progress=not args.no_progress,
                           rules=args.rules, resume=args.resume, overwrite=args.overwrite)
        if args.run:
            summaries = evaluate_run(input_path(args.run), args.backend, base)
            return 1 if any(_errored(s) for s in summaries.values()) else 0
        summary = evaluate(base)
        print_summary(summary, base.out)
        return 1 if _errored(summary) else 0
    except EvaluationInterrupted as exc:
        print_summary(exc.summary, exc.out or base.out)
        print(f"interrupted: {exc}; rerun the same command with --resume to finish", file=sys.stderr)
        return 128 + exc.signum
    except (PolicyError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


def _errored(summary: dict[str, Any]) -> bool:
    return any("errored" in note for note in summary.get("notes", []))


if __name__ == "__main__":
    sys.exit(main())

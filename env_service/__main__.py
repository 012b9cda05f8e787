"""``seal-env`` (``python -m env_service``): start the BFCL environment service, by default on 127.0.0.1:8082."""

from __future__ import annotations

import argparse
import ipaddress
import logging
import os
import sys

import uvicorn

from env_service.budget import Budget
from env_service.config import EpisodeConfig, ServiceConfig, StepLimit
from env_service.protocol import TOKEN_ENV
from env_service.rules import DEFAULT_RULES, RULES


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="seal-env", description=__doc__,
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (off loopback a --token is required)")
    p.add_argument("--port", type=int, default=8082, help="port to listen on")
    p.add_argument(
        "--step-limit-scope",
        choices=["episode", "turn"],
        default="episode",
        help="episode: at most --max-steps model calls per episode (release); turn: per user turn (BFCL)",
    )
    p.add_argument("--max-steps", type=int, default=20, help="the step limit (model calls), see --step-limit-scope")
    p.add_argument(
        "--no-strict-availability",
        action="store_true",
        help="let held-out miss_func tools be called before their reveal turn (official BFCL harness)",
    )
    p.add_argument(
        "--release-reveal-note",
        action="store_true",
        help="append BFCL's 'Python 3 syntax' note to revealed docs, as the release did (bug)",
    )
    p.add_argument(
        "--eval-rules",
        choices=list(RULES),
        default=DEFAULT_RULES,
        help="rules profile of eval-mode episodes whose create request names none (validation); "
        "training episodes always default to release",
    )
    p.add_argument("--ttl", type=float, default=3600.0, help="seconds before an idle episode expires")
    p.add_argument("--max-body-bytes", type=int, default=1 << 20, help="largest request body accepted")
    p.add_argument("--max-episodes", type=int, default=20_000, help="episodes held at once before creates are refused")
    p.add_argument("--split-file", default=None, help="train/eval split JSON (None: data/bfcl_split.json)")
    p.add_argument(
        "--allow-train-on-eval",
        action="store_true",
        help="open training episodes on eval-split tasks (refused by default: 403 eval_task_in_training)",
    )
    p.add_argument(
        "--token",
        default=None,  # read from the environment after parsing: --help never prints a secret
        help=f"require 'Authorization: Bearer <token>' (None: ${TOKEN_ENV}, if set; required off loopback)",
    )
    p.add_argument("--workers", type=int, default=4, help="worker processes running BFCL code (0: in process)")
    budget = Budget()
    p.add_argument("--budget-wall-s", type=float, default=budget.wall_s, help="wall time of one action (s)")
    p.add_argument("--budget-memory-mb", type=int, default=budget.memory_mb, help="memory of one action/episode")
    p.add_argument("--budget-reply-bytes", type=int, default=budget.reply_bytes, help="tool-result text per action")
    p.add_argument("--budget-max-calls", type=int, default=budget.max_calls, help="tool calls per message")
    p.add_argument("--max-connections", type=int, default=512, help="open connections before idle ones are shed")
    p.add_argument("--header-timeout", type=float, default=10.0, help="seconds for a request's headers and body")
    p.add_argument("--log-level", default="warning", help="uvicorn's and the service's log level")
    args = p.parse_args(argv)
    args.token = args.token or os.environ.get(TOKEN_ENV) or None
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    logging.basicConfig(level=args.log_level.upper())
    try:
        loopback = ipaddress.ip_address(args.host).is_loopback
    except ValueError:
        loopback = args.host == "localhost"
    if not loopback and not args.token:
        # Anyone who reaches the port could drive episodes: off loopback a token is required.
        print(
            f"env_service: refusing to serve on {args.host} without a bearer token "
            "(--token or $SEAL_ENV_TOKEN); loopback addresses need none",
            file=sys.stderr,
        )
        raise SystemExit(2)
    from env_service.app import create_app
    from env_service.http import KEEP_ALIVE_S, guarded_protocol

    config = ServiceConfig(
        episode=EpisodeConfig(
            step_limit=StepLimit(args.step_limit_scope, args.max_steps),
            strict_availability=not args.no_strict_availability,
            release_reveal_note=args.release_reveal_note,
            budget=Budget(args.budget_wall_s, args.budget_memory_mb, args.budget_reply_bytes, args.budget_max_calls),
        ),
        workers=args.workers,
        max_connections=args.max_connections,
        header_timeout_s=args.header_timeout,
        ttl_s=args.ttl,
        sweep_interval_s=min(60.0, max(0.05, args.ttl / 4)),
        max_body_bytes=args.max_body_bytes,
        max_episodes=args.max_episodes,
        token=args.token,
        split_file=args.split_file,
        eval_rules=args.eval_rules,
        allow_train_on_eval=args.allow_train_on_eval,
    )
    app = create_app(config, own_process=True)
    print(f"env_service: serving {args.host}:{args.port}", file=sys.stderr, flush=True)
    uvicorn.run(
        app,
        host=args.host,
        port=args.port,
        log_level=args.log_level,
        access_log=False,
        http=guarded_protocol(args.max_connections, args.header_timeout),
        timeout_keep_alive=KEEP_ALIVE_S,
    )


if __name__ == "__main__":
    main()

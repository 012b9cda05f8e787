"""Time A-Patch and the capability-state update on one training step's worth of rollouts.

Default workload: 256 trajectories (32 tasks × 8 rollouts) × 8 tagged turns, response length 1024,
the progress vocabulary, a CPU tensor batch. Budget: A-Patch + capability update ≤ 5 ms.

    python scripts/bench_apatch.py [--trajectories 256] [--turns 8] [--response-len 1024] [--repeats 50] [--threads N]
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

import numpy as np
import torch
from verl import DataProto

from env_service.vocab import VOCABULARIES
from seal.core.apatch import APatchConfig, apply_apatch
from seal.core.capability import CapabilityState
from seal.core.evolve import EvolveConfig, evolve, initial_interface
from seal.core.profile import failure_profile
from seal.core.record import EpisodeRecord
from seal.core.weights import reply_field

BUDGET_MS = 5.0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trajectories", type=int, default=256)
    parser.add_argument("--turns", type=int, default=8)
    parser.add_argument("--response-len", type=int, default=1024)
    parser.add_argument("--repeats", type=int, default=50)
    parser.add_argument("--vocabulary", choices=sorted(VOCABULARIES), default="progress")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=0, help="torch CPU threads (0 = torch's default)")
    args = parser.parse_args()
    if args.threads > 0:
        torch.set_num_threads(args.threads)

    rng = random.Random(args.seed)
    tags_pool = list(VOCABULARIES[args.vocabulary])
    cfg = APatchConfig(vocabulary=args.vocabulary)
    evolve_cfg = EvolveConfig(vocabulary=args.vocabulary)
    state = CapabilityState(vocabulary=args.vocabulary, base_weights=cfg.static_weights(), run_id="bench")
    omega = initial_interface(evolve_cfg)

    n, length = args.trajectories, args.response_len
    tag_rows = [[rng.choice(tags_pool) for _ in range(args.turns)] for _ in range(n)]
    records = [
        EpisodeRecord(f"multi_turn_base_{i // 8}", reward=float(rng.random() < 0.3), accuracy=0.0,
                      **{reply_field(args.vocabulary): tags})
        for i, tags in enumerate(tag_rows)
    ]
    column = np.empty(n, dtype=object)
    column[:] = tag_rows
    lengths = torch.randint(length // 4, length + 1, (n,))
    mask = (torch.arange(length).unsqueeze(0) < lengths.unsqueeze(1)).to(torch.int64)
    advantages = torch.randn(n, 1).expand(n, length) * mask
    data = DataProto.from_dict(
        tensors={"advantages": advantages.clone(), "response_mask": mask},
        non_tensors={cfg.tags_column: column},
    )

    timings: dict[str, list[float]] = {"observe": [], "update_weights": [], "apply_apatch": [], "profile+evolve": []}
    for step in range(1, args.repeats + 1):
        data.batch["advantages"] = advantages.clone()  # fresh GRPO output each step (not timed)
        t0 = time.perf_counter()
        state.observe(records, step=step)
        t1 = time.perf_counter()
        weights = state.update_dynamic_weights()
        t2 = time.perf_counter()
        apply_apatch(data, weights, cfg, global_step=step)
        t3 = time.perf_counter()
        omega = evolve(omega, failure_profile(state), evolve_cfg)
        t4 = time.perf_counter()
        for key, dt in zip(timings, (t1 - t0, t2 - t1, t3 - t2, t4 - t3), strict=True):
            timings[key].append(dt * 1e3)
    parts = (timings["observe"], timings["update_weights"], timings["apply_apatch"])
    total = [sum(values) for values in zip(*parts, strict=True)]

    print(f"{n} trajectories x {args.turns} turns, response_len {length}, {args.vocabulary} vocabulary, "
          f"{args.repeats} steps, torch threads {torch.get_num_threads()}")
    print(f"{'component':<34}{'median ms':>10}{'p90 ms':>10}")
    rows = [*timings.items(), ("A-Patch + capability update", total)]
    for name, values in rows:
        values = sorted(values)
        p90 = values[min(len(values) - 1, int(0.9 * len(values)))]
        print(f"{name:<34}{statistics.median(values):>10.3f}{p90:>10.3f}")
    median_total = statistics.median(total)
    verdict = "within" if median_total <= BUDGET_MS else "OVER"
    print(f"budget {BUDGET_MS:.1f} ms: {verdict} (median {median_total:.3f} ms)")
    return 0 if median_total <= BUDGET_MS else 1


if __name__ == "__main__":
    raise SystemExit(main())

"""A simulation, not a training run: SEAL, adaptive ρ, the failure-profile curriculum, per-task weights and vanilla
GRPO on a synthetic learner, several seeds each, one table (docs/seal_core.md, "Beyond the paper").

The learner. Each of N tasks has 2-4 turns; each turn needs one *skill*, named after a paper failure label
(invalid_tool_call, argument_mismatch, ...), with a per-turn difficulty b. A rollout passes turn i with probability
σ(θ_z + b) for its skill z (independently); it succeeds when every turn passes. A failed turn carries its skill's
label, a passed one `pass`, so each rollout has the per-turn labels SEAL reads. The policy is the vector θ (one
logit per skill); its update is the exact policy gradient of this Bernoulli policy,

    θ_z += lr · η_z · mean_j Â_j · Σ_{turns i of j with skill z} (o_ji − σ(θ_z + b_i)),

with Â_j the advantage each variant produces (GRPO's group-normalised A_j, scaled by A-Patch and/or per-task
weights) and η_z how responsive skill z is to training (some failure types are easy to repair, some hardly at
all). The SEAL parts are the project's own code: `SealController.observe` / `reweight` (capability state, dynamic
weights, A-Patch, adaptive ρ, per-task weights) and `seal.core.curriculum.draw_batch`.

What it can show: how each mechanism redistributes the advantage (and, for the curriculum, the samples) over
failure types and tasks, and whether that speeds up a learner whose failure types differ in repairability, with
the mechanisms' real code. What it cannot show: anything about an LLM — no language, no interface (Ω_t, φ_*
are absent: a simulated turn has no observation to augment), no coupling between skills, no KL or clipping, and
its "repairability" is built in (η_z), so a mechanism that exploits it is favoured by construction. It ranks
mechanisms on a toy, nothing more; the paper's claims need real runs.

Two controls keep the comparison honest. A-Patch multiplies advantages by ρ-weights whose mean is above 1, so it
also takes larger steps than vanilla GRPO at the same learning rate; "SEAL, step size matched" rescales each
step's A-Patch advantages to vanilla GRPO's mean |A| (the same effective step size, only the redistribution
over trajectories left). And the built-in responsiveness ranks the skills almost as the static ρ table does
(printed: Spearman's correlation), which favours A-Patch by construction; the second table draws each seed's
responsiveness at random, independently of ρ. Every number is a mean over seeds with its 95% interval (Student
t), and the difference to vanilla GRPO is paired by seed (same tasks, same start).

    python scripts/sim_curriculum.py [--seeds 20] [--steps 40] [--target 0.5]
"""

from __future__ import annotations

import argparse
import math
import statistics
from collections import Counter
from dataclasses import dataclass

import numpy as np
import torch
from scipy import stats

from env_service import vocab
from seal.core.adaptive import AdaptiveConfig
from seal.core.apatch import APatchSettings
from seal.core.config import DiagnosisConfig, InterfaceConfig, SealConfig
from seal.core.controller import SealController
from seal.core.curriculum import draw_batch
from seal.core.record import EpisodeRecord, record_columns
from seal.core.weights import PAPER_WEIGHTS

SKILLS = (vocab.INVALID_TOOL_CALL, vocab.ARGUMENT_MISMATCH, vocab.STATE_MISMATCH, vocab.RECOVERY_FAILURE,
          vocab.MISSING_TOOL_CALL, vocab.RESPONSE_MISMATCH)
# how strongly each skill responds to its gradient (the built-in "repairability"), and its initial logit
RESPONSIVENESS = {vocab.INVALID_TOOL_CALL: 1.0, vocab.ARGUMENT_MISMATCH: 0.8, vocab.STATE_MISMATCH: 0.4,
                  vocab.RECOVERY_FAILURE: 0.2, vocab.MISSING_TOOL_CALL: 0.9, vocab.RESPONSE_MISMATCH: 0.05}
INITIAL_LOGIT = {vocab.INVALID_TOOL_CALL: 0.0, vocab.ARGUMENT_MISMATCH: 0.5, vocab.STATE_MISMATCH: 1.0,
                 vocab.RECOVERY_FAILURE: 1.5, vocab.MISSING_TOOL_CALL: 0.5, vocab.RESPONSE_MISMATCH: 2.0}

VANILLA = "vanilla GRPO"
VARIANTS = {
    VANILLA: dict(apatch=False),
    "per-task weights (slime)": dict(apatch=False, task_weights="slime"),
    "SEAL": dict(),
    "SEAL, step size matched": dict(match_step=True),
    "SEAL + adaptive rho": dict(rho="adaptive"),
    "SEAL + curriculum": dict(curriculum=True),
}
# vanilla GRPO at a learning rate scaled by SEAL's measured step ratio (mean |Â| / mean |A|), added to the first
# table: does a larger learning rate buy SEAL's lead?
LARGER_LR = "vanilla GRPO, lr × SEAL's step ratio"
# the table with responsiveness drawn independently of rho: the A-Patch comparison only
RANDOM_ETA_VARIANTS = (VANILLA, "SEAL", "SEAL, step size matched")


@dataclass
class World:
    skills: list[list[int]]  # per task: skill index of each turn
    difficulty: list[np.ndarray]  # per task: b of each turn
    ids: list[str]


def make_world(rng: np.random.Generator, num_tasks: int) -> World:
    skills, difficulty = [], []
    for _ in range(num_tasks):
        turns = int(rng.integers(2, 5))
        skills.append([int(s) for s in rng.integers(0, len(SKILLS), size=turns)])
        difficulty.append(rng.normal(0.0, 1.0, size=turns))
    return World(skills, difficulty, [f"multi_turn_base_{i}" for i in range(num_tasks)])


def sigmoid(x: np.ndarray | float) -> np.ndarray | float:
    return 1.0 / (1.0 + np.exp(-x))


def accuracy(theta: np.ndarray, world: World) -> float:
    """Exact expected success over all tasks (no sampling noise)."""
    return float(np.mean([np.prod(sigmoid(theta[s] + b)) for s, b in zip(world.skills, world.difficulty,
                                                                          strict=True)]))


def controller_for(variant: dict) -> SealController:
    cfg = SealConfig(
        diagnosis=DiagnosisConfig(vocabulary="paper"),
        apatch=APatchSettings(enable=variant.get("apatch", True)),
        interface=InterfaceConfig(enable=False),  # a simulated turn has no observation for Ω_t to augment
        adaptive=AdaptiveConfig(rho=variant.get("rho", "fixed"), rho_rate=variant.get("rho_rate", 1.0),
                                task_weights=variant.get("task_weights", "off")),
    )
    return SealController(cfg, run_id="sim")


def grpo(rewards: np.ndarray, group: int) -> np.ndarray:
    """GRPO's group-normalised advantages (unbiased std, eps 1e-6), groups of consecutive rows."""
    r = rewards.reshape(-1, group)
    std = r.std(axis=1, ddof=1, keepdims=True)
    return ((r - r.mean(axis=1, keepdims=True)) / (std + 1e-6)).reshape(-1)


def random_responsiveness(seed: int) -> np.ndarray:
    """Each skill's responsiveness drawn uniformly from [0.05, 1.0], independently of rho and of the other skills."""
    return np.random.default_rng(2000 + seed).uniform(0.05, 1.0, size=len(SKILLS))


def run(variant: dict, seed: int, steps: int, num_tasks: int, batch: int, group: int, lr: float,
        target: float, eta: np.ndarray | None = None, probe: int = 20) -> dict:
    from verl import DataProto

    rng = np.random.default_rng(seed)
    world = make_world(np.random.default_rng(1000 + seed), num_tasks)
    theta = np.array([INITIAL_LOGIT[s] for s in SKILLS]) - 1.0
    eta = np.array([RESPONSIVENESS[s] for s in SKILLS]) if eta is None else eta
    controller = controller_for(variant)
    steps_per_epoch = num_tasks // batch
    order: list[int] = []
    reached, curve = None, []
    samples: Counter[str] = Counter()
    ratios: list[float] = []  # per step: mean |Â| / mean |A| (A-Patch's step size against GRPO's)
    for step in range(1, steps + 1):
        if variant.get("curriculum"):
            chosen = draw_batch(world.ids, controller.repair, 0.2, batch, seed, step)
        else:
            if (step - 1) % steps_per_epoch == 0:
                order = rng.permutation(num_tasks).tolist()
            k = (step - 1) % steps_per_epoch
            chosen = order[k * batch:(k + 1) * batch]
        rows, records = [], []
        for t in chosen:
            s, b = world.skills[t], world.difficulty[t]
            p = sigmoid(theta[s] + b)
            for _ in range(group):
                passed = rng.random(len(s)) < p
                labels = [vocab.PASS if ok else SKILLS[z] for z, ok in zip(s, passed, strict=True)]
                success = bool(passed.all())
                rows.append((t, passed, p))
                # an episode's fields as the engines hand them to the controller
                records.append(EpisodeRecord(world.ids[t], paper_labels=labels, reward=float(success),
                                             accuracy=float(success)))
                samples.update(label for label in labels if label != vocab.PASS)
        controller.observe(records, step)
        adv = grpo(np.array([r.reward for r in records]), group)
        data = DataProto.from_dict(
            tensors={"advantages": torch.tensor(adv, dtype=torch.float32).unsqueeze(-1),
                     "response_mask": torch.ones(len(adv), 1)},
            non_tensors=record_columns(records))  # the columns both engines' batches carry
        controller.reweight(data, step)
        scaled = data.batch["advantages"][:, 0].numpy().astype(np.float64)
        if np.abs(adv).mean() > 0:
            ratios.append(float(np.abs(scaled).mean() / np.abs(adv).mean()))
        if variant.get("match_step") and np.abs(scaled).mean() > 0:
            scaled *= np.abs(adv).mean() / np.abs(scaled).mean()  # vanilla GRPO's mean |A| this step
        grad = np.zeros(len(SKILLS))
        for a, (t, passed, p) in zip(scaled, rows, strict=True):
            np.add.at(grad, world.skills[t], a * (passed.astype(float) - p))
        theta += lr * eta * grad / len(rows)
        if step % steps_per_epoch == 0:
            controller.end_epoch()
        acc = accuracy(theta, world)
        curve.append(acc)
        if reached is None and acc >= target:
            reached = step
    repair = {s: controller.repair.repairability(s) for s in SKILLS if s in controller.repair.visits}
    return {"final": curve[-1], "probe": curve[probe - 1], "reached": reached, "samples": samples,
            "step_ratio": statistics.mean(ratios) if ratios else 1.0, "repairability": repair}


def interval(values: list[float]) -> str:
    """Mean and half-width of its 95% interval (Student t over the seeds)."""
    n = len(values)
    mean = statistics.mean(values)
    if n < 2:
        return f"{mean:.3f}"
    half = stats.t.ppf(0.975, n - 1) * statistics.stdev(values) / math.sqrt(n)
    return f"{mean:.3f} ± {half:.3f}"


def table(names: list[str], args: argparse.Namespace, random_eta: bool) -> dict[str, list[dict]]:
    print(f"| variant | steps to target (median; reached) | accuracy at step {args.probe} | final accuracy "
          f"| Δ vs vanilla at step {args.probe} (paired) | Δ final (paired) | failed-turn samples per type |")
    print("|---|---|---|---|---|---|---|")
    results: dict[str, list[dict]] = {}

    def runs(variant: dict, lr: float) -> list[dict]:
        return [run(variant, seed, args.steps, args.tasks, args.batch, args.group, lr, args.target,
                    random_responsiveness(seed) if random_eta else None, args.probe) for seed in range(args.seeds)]

    for name in names:
        results[name] = runs(VARIANTS[name], args.lr)
    if not random_eta:  # vanilla GRPO at the learning rate SEAL's A-Patch effectively had
        ratio = statistics.mean(r["step_ratio"] for r in results["SEAL"])
        results[f"{LARGER_LR} ({ratio:.3f})"] = runs(VARIANTS[VANILLA], args.lr * ratio)
    base = results[VANILLA]
    for name, rs in results.items():
        reached = [r["reached"] for r in rs if r["reached"] is not None]
        median = f"{statistics.median(reached):.0f}" if len(reached) * 2 > len(rs) else f"> {args.steps}"
        total = sum((r["samples"] for r in rs), Counter())
        per_type = " / ".join(f"{total[s] / len(rs):.0f}" for s in SKILLS)
        if name == VANILLA:
            d_probe = d_final = "–"
        else:
            d_probe = interval([r["probe"] - b["probe"] for r, b in zip(rs, base, strict=True)])
            d_final = interval([r["final"] - b["final"] for r, b in zip(rs, base, strict=True)])
        print(f"| {name} | {median} ({len(reached)}/{len(rs)}) | {interval([r['probe'] for r in rs])} "
              f"| {interval([r['final'] for r in rs])} | {d_probe} | {d_final} | {per_type} |")
    return results


def extras(results: dict[str, list[dict]], args: argparse.Namespace) -> None:
    """The numbers docs/seal_core.md states beside the first table: the curriculum's own gain (paired against SEAL,
    which it adds to) and the repairability adaptive ρ measured per type (mean over seeds, at the end)."""
    seal, cur = results["SEAL"], results["SEAL + curriculum"]
    print(f"\nCurriculum's own gain (SEAL + curriculum - SEAL, paired): at step {args.probe} "
          f"{interval([c['probe'] - s['probe'] for c, s in zip(cur, seal, strict=True)])}, final "
          f"{interval([c['final'] - s['final'] for c, s in zip(cur, seal, strict=True)])}")
    adaptive = results["SEAL + adaptive rho"]
    parts = [f"{s} {interval([r['repairability'][s] for r in adaptive if s in r['repairability']])}" for s in SKILLS]
    print(f"Repairability measured by adaptive rho at step {args.steps} (built-in responsiveness "
          f"{', '.join(f'{RESPONSIVENESS[s]}' for s in SKILLS)}): {'; '.join(parts)}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seeds", type=int, default=20)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--probe", type=int, default=20, help="step whose accuracy is compared mid-learning")
    ap.add_argument("--tasks", type=int, default=64)
    ap.add_argument("--batch", type=int, default=16, help="tasks per step")
    ap.add_argument("--group", type=int, default=8, help="rollouts per task")
    ap.add_argument("--lr", type=float, default=2.0)
    ap.add_argument("--target", type=float, default=0.5, help="accuracy for the steps-to-target column")
    args = ap.parse_args(argv)
    if not 1 <= args.probe <= args.steps:
        ap.error("--probe must lie in [1, --steps]")
    start = accuracy(np.array([INITIAL_LOGIT[s] for s in SKILLS]) - 1.0,
                     make_world(np.random.default_rng(1000), args.tasks))
    rho = [PAPER_WEIGHTS[s] for s in SKILLS]
    built_in = [RESPONSIVENESS[s] for s in SKILLS]
    print(f"SIMULATION (synthetic learner, not an LLM): {args.tasks} tasks, {args.batch} tasks x {args.group} "
          f"rollouts per step, {args.steps} steps, seeds 0..{args.seeds - 1}; accuracy at step 0 (seed 0): "
          f"{start:.3f}; target {args.target}; mean ± 95% interval over seeds")
    print(f"\nBuilt-in responsiveness ({', '.join(f'{s}={RESPONSIVENESS[s]}' for s in SKILLS)}); Spearman "
          f"correlation with the static rho table: {stats.spearmanr(built_in, rho).statistic:.2f}")
    extras(table(list(VARIANTS), args, random_eta=False), args)
    draws = [random_responsiveness(seed) for seed in range(args.seeds)]
    rhos = [stats.spearmanr(d, rho).statistic for d in draws]
    print(f"\nResponsiveness drawn per seed, uniform in [0.05, 1.0] and independent of rho (Spearman with rho: "
          f"{interval(rhos)})")
    table(list(RANDOM_ETA_VARIANTS), args, random_eta=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Closed loop without a model: 30 simulated GRPO steps whose failure mix shifts half-way.

Each step: synthetic rollouts (8 tasks × 8 samples × 4 turns) -> capability state observes ->
dynamic weights update -> A-Patch on a real verl DataProto with GRPO advantages -> C_t -> Ω_{t+1}.
Windows reset every 6 steps (an "epoch"). Phase 1 (steps 1-15) fails mostly on missing calls
(empty turns / missing_tool_call), phase 2 (steps 16-30) mostly on state mismatches. The weights
and the cues must follow the shift.

Script form (writes runs/closed_loop_trace.json): ``python -m tests.core.test_closed_loop [vocabulary]``.
"""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from seal.core.apatch import APatchConfig, apply_apatch
from seal.core.capability import CapabilityState
from seal.core.evolve import EvolveConfig, evolve, initial_interface
from seal.core.profile import failure_profile
from seal.core.record import EpisodeRecord

STEPS, SHIFT_AFTER, EPOCH_STEPS = 30, 15, 6
TASKS, SAMPLES, TURNS = 8, 8, 4
TURN_FAILURE_RATE = 0.35
# (main failure of phase 1, main failure of phase 2, background failure) per vocabulary
SCENARIOS = {
    "progress": ("empty_turn_model_response", "state_mismatch", "response_mismatch"),
    "paper": ("missing_tool_call", "state_mismatch", "response_mismatch"),
}


def simulate(vocabulary: str, seed: int = 0) -> list[dict]:
    """Run the loop; return one trace entry per step (step 0 = the initial state)."""
    from verl import DataProto
    from verl.trainer.ppo.core_algos import compute_grpo_outcome_advantage

    first, second, background = SCENARIOS[vocabulary]
    rng = random.Random(seed)
    apatch_cfg = APatchConfig(vocabulary=vocabulary)
    evolve_cfg = EvolveConfig(vocabulary=vocabulary, error_feedback="adaptive")  # φ_err gated by C_t (ours)
    state = CapabilityState(vocabulary=vocabulary, base_weights=apatch_cfg.static_weights(), run_id="sim")
    omega = initial_interface(evolve_cfg)
    trace = [{"step": 0, "weights": state.dynamic_weights, "interface": omega}]

    for step in range(1, STEPS + 1):
        main_failure = first if step <= SHIFT_AFTER else second
        records, tag_rows, uids = [], [], []
        for task in range(TASKS):
            for _ in range(SAMPLES):
                tags = [
                    (main_failure if rng.random() < 0.8 else background)
                    if rng.random() < TURN_FAILURE_RATE else "pass"
                    for _ in range(TURNS)
                ]
                reward = 1.0 if all(t == "pass" for t in tags) else 0.0
                records.append(EpisodeRecord(f"multi_turn_base_{task}", failure_tags=tags, paper_labels=tags,
                                             reward=reward, accuracy=reward))
                tag_rows.append(tags)
                uids.append(f"task{task}")

        state.observe(records, step=step)
        weights = state.update_dynamic_weights()

        n, length = len(records), 4
        scores = torch.zeros(n, length)
        scores[:, -1] = torch.tensor([r.reward for r in records])
        mask = torch.ones(n, length)
        uid = np.array(uids, dtype=object)
        advantages, _ = compute_grpo_outcome_advantage(scores, mask, uid)
        column = np.empty(n, dtype=object)
        column[:] = tag_rows
        batch = DataProto.from_dict(
            tensors={"advantages": advantages, "response_mask": mask},
            non_tensors={apatch_cfg.tags_column: column, "uid": uid},
        )
        apatch = apply_apatch(batch, weights, apatch_cfg, global_step=step)

        profile = failure_profile(state)
        omega = evolve(omega, profile, evolve_cfg)
        trace.append(
            {
                "step": step,
                "phase": 1 if step <= SHIFT_AFTER else 2,
                "reward_mean": sum(r.reward for r in records) / n,
                "profile_source": profile.source,
                "prevalence": {t: round(p.prevalence, 4) for t, p in profile.tags.items()},
                "weights": weights,
                "apatch_mean_scale": apatch["apatch/mean_scale"],
                "interface": omega,
            }
        )
        if step % EPOCH_STEPS == 0:
            state.reset_window()
    return trace


def cue_tags(entry: dict) -> list[str]:
    return [c["tag"] for c in entry["interface"]["cues"]]


@pytest.mark.parametrize("vocabulary", sorted(SCENARIOS))
def test_weights_and_cues_follow_the_shift(vocabulary, tmp_path):
    first, second, background = SCENARIOS[vocabulary]
    trace = simulate(vocabulary)
    path = tmp_path / "closed_loop_trace.json"
    path.write_text(json.dumps(trace, indent=1))
    assert len(json.loads(path.read_text())) == STEPS + 1

    start, mid, end = trace[0], trace[SHIFT_AFTER], trace[STEPS]
    # phase 1: the missing-call failure gains weight and gets a cue; state mismatch gets neither
    assert mid["weights"][first] > start["weights"][first]
    assert mid["weights"][second] == pytest.approx(start["weights"][second])
    assert first in cue_tags(mid) and second not in cue_tags(mid)
    # phase 2: state mismatch gains, the missing-call weight relaxes back towards its base, cues swap
    assert end["weights"][second] > mid["weights"][second] + 0.1
    assert end["weights"][first] < mid["weights"][first]
    assert second in cue_tags(end) and first not in cue_tags(end)
    # the rare background failure never crosses the cue threshold
    assert all(background not in cue_tags(e) for e in trace)
    # φ_err: empty turns are an error-feedback tag of the progress vocabulary; missing calls are not
    # one of the paper vocabulary, and state mismatches are neither
    assert mid["interface"]["error_feedback"] is (vocabulary == "progress")
    assert end["interface"]["error_feedback"] is False
    # no flapping: the interface changes a handful of times in 30 steps, never within a settled phase
    assert end["interface"]["version"] <= 5
    assert all(cue_tags(e) == cue_tags(mid) for e in trace[3:SHIFT_AFTER + 1])
    assert all(cue_tags(e) == cue_tags(end) for e in trace[4 * EPOCH_STEPS + 1:])
    # A-Patch acts: failures of the boosted kind scale their (negative) advantages up
    assert mid["apatch_mean_scale"] > 1.0


if __name__ == "__main__":
    vocab_arg = sys.argv[1] if len(sys.argv) > 1 else "progress"
    out = Path("runs/closed_loop_trace.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    result = simulate(vocab_arg)
    out.write_text(json.dumps(result, indent=1))
    for e in result:
        w = e["weights"]
        print(e["step"], {k: round(v, 3) for k, v in w.items() if v != 1.0}, cue_tags(e),
              e["interface"]["error_feedback"], e["interface"]["version"])
    print(f"wrote {out}")

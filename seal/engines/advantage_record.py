"""`<run>/advantages.jsonl`: per training step, every row's GRPO advantage and the advantage the actor update was
given, with what A-Patch read (its tags, weights and knobs), so that a run can be checked from outside: the update
used GRPO × the A-Patch scale of each row's tags (`check_advantage_record`).

One JSON object per line, one line per step (docs/run_directory.md):

    {"step": N, "norm_adv_by_std": bool, "task_weights": "off",
     "apatch": {"enabled": bool, "warmup_steps": int, "apply_to": "all", "min_scale": float, "max_scale": float,
                "tags_column": str, "weights": {tag: float}},
     "rows": [{"uid": str, "task_id": str, "reward": float, "excluded": bool, "tags": [str] | null,
               "grpo": float | null, "used": float | null, "spread": float}]}

`grpo` is the row's GRPO advantage as verl computed it (after excluded rows were zeroed), `used` the advantage
handed to verl's actor update (what `_compute_advantage` writes back for `update_actor`), each the mean over the
row's response tokens, `spread` the largest range of either over those tokens (0 for outcome rewards: one value
per row); null without a response token (a placeholder row). A resumed run appends the steps it redoes again; the
checker reads the last line of each step. The record is the checker's input, not a log: a step whose record
cannot be written fails (a silent gap would pass a check of the steps left).
"""

from __future__ import annotations

import json
import math
from collections import defaultdict
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

ADVANTAGES_FILE = "advantages.jsonl"
GRPO_EPSILON = 1e-6  # verl's compute_grpo_outcome_advantage default, which both engines use
TOLERANCE = 1e-5  # float32 advantages: relative to max(1, |expected|)


def row_values(advantages: Any, mask: Any) -> list[tuple[float | None, float]]:
    """Per row of `advantages` [B, R]: (mean over `mask`ed tokens or None, max - min over them)."""
    out = []
    for adv, m in zip(advantages.detach().cpu().double().numpy(), mask.detach().cpu().bool().numpy(), strict=True):
        vals = adv[m]
        out.append((None, 0.0) if vals.size == 0 else (float(vals.mean()), float(vals.max() - vals.min())))
    return out


def step_record(step: int, data: Any, grpo: Sequence[tuple[float | None, float]], apatch: Mapping[str, Any],
                norm_adv_by_std: bool, task_weights: str, excluded: Sequence[bool]) -> dict[str, Any]:
    """One step's line from the batch after the advantage step (`data`: a verl `DataProto` with `advantages`,
    `response_mask`, `token_level_rewards`, non-tensor `uid`, `task_id` and A-Patch's tags column) and the GRPO
    values taken before A-Patch (`row_values`)."""
    used = row_values(data.batch["advantages"], data.batch["response_mask"])
    rewards = data.batch["token_level_rewards"].sum(-1).tolist()
    tags = data.non_tensor_batch.get(apatch["tags_column"])
    task_ids = data.non_tensor_batch.get("task_id")
    rows = []
    for i, uid in enumerate(data.non_tensor_batch["uid"]):
        row_tags = None if tags is None or tags[i] is None else [str(t) for t in list(tags[i])]
        rows.append({"uid": str(uid), "task_id": None if task_ids is None else str(task_ids[i]),
                     "reward": float(rewards[i]), "excluded": bool(excluded[i]), "tags": row_tags or None,
                     "grpo": grpo[i][0], "used": used[i][0], "spread": max(grpo[i][1], used[i][1])})
    return {"step": int(step), "norm_adv_by_std": bool(norm_adv_by_std), "task_weights": task_weights,
            "apatch": dict(apatch), "rows": rows}


def append_record(path: str | Path, record: Mapping[str, Any]) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a", encoding="utf-8") as f:
        f.write(json.dumps(record, sort_keys=True) + "\n")


def read_records(path: str | Path) -> dict[int, dict[str, Any]]:
    """The record's steps, the last line of each (a resumed run redoes steps)."""
    out: dict[int, dict[str, Any]] = {}
    for line in Path(path).read_text(encoding="utf-8").splitlines():
        if line.strip():
            record = json.loads(line)
            out[int(record["step"])] = record
    return out


def grpo_of(rewards: Sequence[float], uids: Sequence[str], norm_adv_by_std: bool) -> list[float]:
    """GRPO from the rows' rewards, written from the paper's definition (not verl's code): each uid group's reward
    minus the group mean, over the group's unbiased std + 1e-6 (when normalised); a lone row gets its reward."""
    groups: dict[str, list[float]] = defaultdict(list)
    for r, u in zip(rewards, uids, strict=True):
        groups[u].append(float(r))
    out = []
    for r, u in zip(rewards, uids, strict=True):
        g = groups[u]
        mean, std = (0.0, 1.0) if len(g) == 1 else (float(np.mean(g)), float(np.std(g, ddof=1)))
        out.append((r - mean) / (std + GRPO_EPSILON) if norm_adv_by_std else r - mean)
    return out


def expected_used(grpo: float, tags: Sequence[str] | None, apatch: Mapping[str, Any], step: int) -> float:
    """GRPO × the A-Patch scale of the row's tags (seal.core.apatch.trajectory_scale), as the knobs say."""
    from seal.core.apatch import trajectory_scale

    if not apatch["enabled"] or step < int(apatch["warmup_steps"]) or not tags:
        return grpo
    scale = trajectory_scale(tags, apatch["weights"], apatch["min_scale"], apatch["max_scale"])
    applies = {"all": True, "positive": grpo > 0, "negative": grpo < 0}[apatch["apply_to"]]
    return grpo * scale if applies else grpo


def check_advantage_record(path: str | Path, steps: Sequence[int] | None = None) -> dict[str, int]:
    """Check `<run>/advantages.jsonl`: for every row of every step (or of `steps`), the recorded GRPO advantage is
    GRPO of the rewards (`grpo_of`; 0 for an excluded row) and the advantage the update was given is that times
    the A-Patch scale of the row's tags (`expected_used`). Raises AssertionError naming the first wrong rows;
    returns counts (steps, rows checked, rows scaled ≠ 1, rows without a response token)."""
    records = read_records(path)
    wanted = sorted(records) if steps is None else list(steps)
    missing = [s for s in wanted if s not in records]
    assert records and not missing, f"{path}: no record of step(s) {missing or 'any'} (has {sorted(records)})"
    counts = {"steps": 0, "rows": 0, "scaled": 0, "no_tokens": 0}
    for step in wanted:
        rec = records[step]
        assert rec["task_weights"] == "off", (
            f"step {step}: seal.adaptive.task_weights={rec['task_weights']} also scales the advantages; this check "
            "recomputes GRPO × A-Patch only")
        rows = rec["rows"]
        groups = grpo_of([r["reward"] for r in rows], [r["uid"] for r in rows], rec["norm_adv_by_std"])
        wrong = []
        for i, (row, g) in enumerate(zip(rows, groups, strict=True)):
            if row["grpo"] is None or row["used"] is None:
                counts["no_tokens"] += 1
                continue
            want_grpo = 0.0 if row["excluded"] else g
            want_used = expected_used(want_grpo, row["tags"], rec["apatch"], step)
            ok = all(math.isclose(a, b, rel_tol=0, abs_tol=TOLERANCE * max(1.0, abs(b)))
                     for a, b in ((row["grpo"], want_grpo), (row["used"], want_used)))
            if not ok or row["spread"] > TOLERANCE * max(1.0, abs(want_used)):
                wrong.append(f"row {i} ({row['task_id']}, tags {row['tags']}): grpo {row['grpo']} (want "
                             f"{want_grpo}), used {row['used']} (want {want_used}), spread {row['spread']}")
            counts["rows"] += 1
            counts["scaled"] += int(not math.isclose(want_used, want_grpo))
        assert not wrong, f"{path} step {step}: {len(wrong)} row(s) off: " + "; ".join(wrong[:5])
        counts["steps"] += 1
    return counts

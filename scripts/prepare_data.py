"""Build data/bfcl_train.parquet, data/bfcl_eval_400.parquet and data/bfcl_split.json.

Sources: the ``bfcl-eval`` package data (tasks, ground truth; docs/dependencies.md §1.3) and the authors'
split, which is the committed ``data/bfcl_split.json`` (the ids of the released parquets, in their order;
docs/release_behaviour.md §14). The output is deterministic: a rebuild is byte-identical.

    python scripts/prepare_data.py [--split-ids PATH] [--out data]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

REPO = Path(__file__).resolve().parent.parent

from env_service.tasks import load_tasks  # noqa: E402
from env_service.vocab import CATEGORIES, category_of  # noqa: E402

COMMITTED_SPLIT = REPO / "data" / "bfcl_split.json"
OUTPUTS = {"train": "bfcl_train.parquet", "eval": "bfcl_eval_400.parquet"}

SCHEMA = pa.schema(
    [
        ("data_source", pa.string()),
        ("agent_name", pa.string()),
        ("prompt", pa.list_(pa.struct([("role", pa.string()), ("content", pa.string())]))),
        ("ability", pa.string()),
        ("reward_model", pa.struct([("style", pa.string()), ("ground_truth", pa.string())])),
        (
            "extra_info",
            pa.struct(
                [
                    ("task_id", pa.string()),
                    ("index", pa.string()),
                    ("category", pa.string()),
                    ("split", pa.string()),
                    ("num_turns", pa.int64()),
                ]
            ),
        ),
    ]
)


def read_split(path: Path) -> dict[str, list[str]]:
    raw = json.loads(path.read_text())
    return {"train": list(raw["train"]), "eval": list(raw["eval"])}


def check_split(split: dict[str, list[str]]) -> None:
    """400/400, 100 per category, no id or scenario shared between train and eval."""
    for name, ids in split.items():
        if len(ids) != 400 or len(set(ids)) != 400:
            raise ValueError(f"{name}: expected 400 distinct ids, got {len(set(ids))}")
        for category in CATEGORIES:
            n = sum(category_of(i) == category for i in ids)
            if n != 100:
                raise ValueError(f"{name}: {category} has {n} tasks, expected 100")
    scenarios = [{i.rsplit("_", 1)[1] for i in split[s]} for s in ("train", "eval")]
    if scenarios[0] & scenarios[1]:
        raise ValueError(f"scenario numbers shared between train and eval: {sorted(scenarios[0] & scenarios[1])[:5]}")


def rows_for(ids: list[str], split_name: str) -> list[dict]:
    tasks = load_tasks()
    rows = []
    for task_id in ids:
        task = tasks[task_id]
        rows.append(
            {
                "data_source": task.category,
                "agent_name": "seal_bfcl",
                # The env service builds the real prompt; this is the first user turn, for inspection and
                # for verl's dataset, which needs a chat-format prompt column.
                "prompt": [{"role": "user", "content": task.questions[0]}],
                "ability": "multi_turn_function_calling",
                "reward_model": {"style": "interaction", "ground_truth": json.dumps(task.ground_truth)},
                "extra_info": {
                    "task_id": task_id,
                    "index": task_id,
                    "category": task.category,
                    "split": split_name,
                    "num_turns": task.num_turns,
                },
            }
        )
    return rows


def build(split_source: Path, out_dir: Path) -> dict[str, Path]:
    split = read_split(split_source)
    check_split(split)
    out_dir.mkdir(parents=True, exist_ok=True)
    written = {}
    for name, filename in OUTPUTS.items():
        table = pa.Table.from_pylist(rows_for(split[name], name), schema=SCHEMA)
        path = out_dir / filename
        pq.write_table(table, path, compression="zstd", write_statistics=False, store_schema=False)
        written[name] = path
    split_path = out_dir / "bfcl_split.json"
    payload = {"source": "authors' split (released SEAL parquet extra_info.index)", **split}
    split_path.write_text(json.dumps(payload, indent=1) + "\n")
    written["split"] = split_path
    return written


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--split-ids", type=Path, default=COMMITTED_SPLIT)
    parser.add_argument("--out", type=Path, default=REPO / "data")
    args = parser.parse_args()
    for name, path in build(args.split_ids, args.out).items():
        print(f"{name:6s} -> {path}")


if __name__ == "__main__":
    main()

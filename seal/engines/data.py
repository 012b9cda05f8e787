"""The training data both engines read: task ids of a parquet split, and the task subset rule.

`data.max_train_tasks` / `max_val_tasks` keep the first n tasks taken round-robin over the categories
(the paper's four in their order, then any other sorted), in file order within a category: the first
task of each category, then the second, ... so a handful of tasks still covers every category. The
local engine applies the rule to the task list it trains on; the verl engine writes the same rows to
a subset parquet that verl's data loader reads. `data.train_task_ids` / `val_task_ids` name the tasks
instead (in the order given; an id the split lacks is an error), for smoke runs on chosen tasks.
The rule lives here, beside the batching both engines share (seal/engines/batching.py), because it
is about the engines' input files: `env_service` serves tasks by id and never sees a split file, and
the two engine packages must not import each other.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from env_service.vocab import CATEGORIES, category_of


@dataclass(frozen=True)
class Task:
    task_id: str
    category: str


def round_robin(categories: Sequence[str], n: int | None) -> list[int]:
    """Indices of the subset: the first `n` rows taken round-robin over `categories` (one per row).

    `n` None, or at least the number of rows, keeps every row in file order.
    """
    if n is None or n >= len(categories):
        return list(range(len(categories)))
    if n < 0:
        raise ValueError(f"a task subset needs n >= 0, got {n}")
    by_cat: dict[str, list[int]] = {}
    for i, c in enumerate(categories):
        by_cat.setdefault(str(c), []).append(i)
    order = [c for c in CATEGORIES if c in by_cat] + sorted(c for c in by_cat if c not in CATEGORIES)
    out: list[int] = []
    depth = 0
    while len(out) < n:
        for c in order:
            if depth < len(by_cat[c]) and len(out) < n:
                out.append(by_cat[c][depth])
        depth += 1
    return out


def _read_split(path: str | os.PathLike[str]) -> Any:
    import pandas as pd

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"data file not found: {path}")
    return pd.read_parquet(path)


def _row_task(row: Any, path: Path) -> Task:
    extra = row.get("extra_info")
    extra = extra if isinstance(extra, dict) else {}
    task_id = extra.get("task_id") or extra.get("index") or extra.get("original_id")
    if not task_id:
        raise ValueError(f"{path}: a row has no extra_info.task_id / index")
    category = extra.get("category") or row.get("data_source") or category_of(task_id)
    return Task(str(task_id), str(category))


def split_tasks(frame: Any, path: str | os.PathLike[str]) -> list[Task]:
    """The task of each row of a split's data frame (`extra_info.task_id`, its category)."""
    return [_row_task(row, Path(path)) for _, row in frame.iterrows()]


def wants_subset(n: int | None, ids: Sequence[str] | None) -> bool:
    """Whether `data.max_*_tasks` (`n`) or `data.*_task_ids` (`ids`) ask for a subset of a split."""
    return n is not None or bool(ids)


def subset_rows(tasks: Sequence[Task], n: int | None = None, ids: Sequence[str] | None = None) -> list[int]:
    """Row indices of a split's subset: the tasks named by `ids` (in that order), else the round-robin
    rule; `n` caps the count either way."""
    if not ids:
        return round_robin([t.category for t in tasks], n)
    row_of = {t.task_id: i for i, t in enumerate(tasks)}
    missing = [i for i in ids if i not in row_of]
    if missing:
        raise ValueError(f"task ids not in the split: {', '.join(missing)}")
    rows = list(dict.fromkeys(row_of[i] for i in ids))
    return rows if n is None else rows[:n]


def load_tasks(path: str | os.PathLike[str], limit: int | None = None,
               ids: Sequence[str] | None = None) -> list[Task]:
    """Task ids (and categories) of a parquet split (`data/bfcl_*.parquet`), subset by `subset_rows`."""
    tasks = split_tasks(_read_split(path), path)
    return [tasks[i] for i in subset_rows(tasks, limit, ids)]


def write_subset(path: str | os.PathLike[str], n: int | None, out: Path, ids: Sequence[str] | None = None) -> str:
    """The subset's rows of a split written to `out` (the split itself when the subset is all of it)."""
    frame = _read_split(path)
    rows = subset_rows(split_tasks(frame, path), n, ids)
    if rows == list(range(len(frame))):
        return str(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    frame.iloc[rows].reset_index(drop=True).to_parquet(out)
    return str(out)


def eval_overlap(train_files: str | os.PathLike[str], limit: int | None = None, ids: Sequence[str] | None = None,
                 split_file: str | os.PathLike[str] | None = None) -> list[str]:
    """The tasks a run would train on (`train_files` subset as `load_tasks` subsets it) that belong to the eval
    split of `split_file` (default ``data/bfcl_split.json``): held-in accuracy measured on them would be
    accuracy on tasks the policy trained on."""
    from env_service.tasks import load_split

    held_out = set(load_split(None if split_file is None else str(split_file))["eval"])
    return [t.task_id for t in load_tasks(train_files, limit, ids) if t.task_id in held_out]

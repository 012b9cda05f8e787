"""seal/engines/data.py: the task subset rule both engines use."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from env_service.vocab import CATEGORIES
from seal.engines.data import load_tasks, round_robin, write_subset

REPO = Path(__file__).resolve().parents[2]
TRAIN = REPO / "data" / "bfcl_train.parquet"
BASE, MISS_FUNC, MISS_PARAM, LONG = CATEGORIES


def test_round_robin_over_the_paper_categories_then_the_others():
    cats = [LONG, BASE, "zzz", BASE, "aaa", MISS_FUNC, LONG, BASE]
    # paper order (base, miss_func, miss_param, long_context), then unknown ones sorted; file order inside each
    assert round_robin(cats, 5) == [1, 5, 0, 4, 2]
    assert round_robin(cats, 7) == [1, 5, 0, 4, 2, 3, 6]
    assert round_robin(cats, None) == list(range(8)) and round_robin(cats, 8) == list(range(8))
    assert round_robin(cats, 100) == list(range(8)) and round_robin(cats, 0) == []
    with pytest.raises(ValueError, match="n >= 0"):
        round_robin(cats, -1)


def test_both_engines_take_the_same_tasks(tmp_path):
    tasks = load_tasks(TRAIN, 6)
    assert [t.category for t in tasks] == [*CATEGORIES, BASE, MISS_FUNC]
    out = write_subset(str(TRAIN), 6, tmp_path / "data" / "train_subset.parquet")
    assert out == str(tmp_path / "data" / "train_subset.parquet")
    subset = pd.read_parquet(out)
    assert [e["task_id"] for e in subset.extra_info] == [t.task_id for t in tasks]
    assert load_tasks(out) == tasks  # the subset file, read back, is the local engine's list
    assert write_subset(str(TRAIN), 400, tmp_path / "all.parquet") == str(TRAIN)  # covers it: the file itself
    assert not (tmp_path / "all.parquet").exists()


def test_bad_split_files(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope"):
        load_tasks(tmp_path / "nope.parquet")
    pd.DataFrame([{"data_source": BASE, "extra_info": {"split": "train"}}]).to_parquet(tmp_path / "bad.parquet")
    with pytest.raises(ValueError, match="task_id"):
        load_tasks(tmp_path / "bad.parquet")


def test_tasks_named_by_id_in_the_order_given(tmp_path):
    ids = ["multi_turn_miss_func_3", "multi_turn_base_0", "multi_turn_miss_func_3"]
    tasks = load_tasks(TRAIN, None, ids)
    assert [t.task_id for t in tasks] == ids[:2]  # a repeated id is kept once
    assert [t.task_id for t in load_tasks(TRAIN, 1, ids)] == ids[:1]  # max_*_tasks still caps the count
    out = write_subset(str(TRAIN), None, tmp_path / "named.parquet", ids)
    assert [t.task_id for t in load_tasks(out)] == ids[:2]  # the verl engine's file holds the same tasks
    with pytest.raises(ValueError, match="not in the split: multi_turn_base_999"):
        load_tasks(TRAIN, None, ["multi_turn_base_0", "multi_turn_base_999"])

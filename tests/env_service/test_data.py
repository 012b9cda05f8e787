"""The committed data files: the authors' split, 100 tasks per category, scenario-disjoint, rebuilt byte-identically."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from env_service.vocab import CATEGORIES, category_of

REPO = Path(__file__).resolve().parents[2]
DATA = REPO / "data"
SHARED_SPLIT = REPO.parent / "shared" / "data" / "bfcl_split_ids.json"


def _prepare_module():
    spec = importlib.util.spec_from_file_location("prepare_data", REPO / "scripts" / "prepare_data.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_parquets_hold_the_split():
    split = json.loads((DATA / "bfcl_split.json").read_text())
    for name, filename in (("train", "bfcl_train.parquet"), ("eval", "bfcl_eval_400.parquet")):
        rows = pq.read_table(DATA / filename).to_pylist()
        ids = [r["extra_info"]["task_id"] for r in rows]
        assert ids == split[name] and len(set(ids)) == 400
        for category in CATEGORIES:
            assert sum(category_of(i) == category for i in ids) == 100
        assert all(r["data_source"] == category_of(r["extra_info"]["task_id"]) for r in rows)
        assert all(r["extra_info"]["split"] == name for r in rows)
    train_scenarios = {i.rsplit("_", 1)[1] for i in split["train"]}
    eval_scenarios = {i.rsplit("_", 1)[1] for i in split["eval"]}
    assert not train_scenarios & eval_scenarios


@pytest.mark.skipif(not SHARED_SPLIT.exists(), reason="the authors' split file is only beside the checkout")
def test_split_is_the_authors():
    authors = json.loads(SHARED_SPLIT.read_text())
    ours = json.loads((DATA / "bfcl_split.json").read_text())
    assert ours["train"] == authors["train"] and ours["eval"] == authors["eval"]


def test_rebuild_is_byte_identical(tmp_path):
    prepare = _prepare_module()
    written = prepare.build(DATA / "bfcl_split.json", tmp_path)
    for path in written.values():
        assert path.read_bytes() == (DATA / path.name).read_bytes(), path.name


def test_bad_split_is_refused(tmp_path):
    prepare = _prepare_module()
    split = json.loads((DATA / "bfcl_split.json").read_text())
    split["eval"][0] = split["train"][0]  # a scenario in both
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(split))
    with pytest.raises(ValueError):
        prepare.build(bad, tmp_path / "out")

"""The committed data files: the authors' split, 100 tasks per category, scenario-disjoint, rebuilt byte-identically."""

from __future__ import annotations

import hashlib
import importlib.util
import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from env_service.vocab import CATEGORIES, category_of

REPO = Path(__file__).resolve().parents[2]
DATA = REPO / "data"

# The authors' split: the ids of the released SEAL parquets (extra_info.index), in their order
# (docs/release_behaviour.md §14). data/bfcl_split.json is the source of truth; these digests pin it to the
# authors' ids, so an edit of the committed file (or a rebuild from another split) fails here.
AUTHORS_SHA256 = {
    "train": "9db0d6eb162139a3badf6b06f3489f73946f0a9d5ea2d7fcf641cd1829e83bc4",
    "eval": "3fc35956f05550d209d3745d49bc0300e7af63b378f6379b0d7fdc20d38ce8a3",
}
AUTHORS_ENDS = {
    "train": ("multi_turn_base_0", "multi_turn_base_2", "multi_turn_long_context_196"),
    "eval": ("multi_turn_base_4", "multi_turn_base_9", "multi_turn_long_context_199"),
}


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


def _ids_digest(ids: list[str]) -> str:
    return hashlib.sha256("\n".join(ids).encode()).hexdigest()


def test_split_is_the_authors():
    ours = json.loads((DATA / "bfcl_split.json").read_text())
    for name in ("train", "eval"):
        ids = ours[name]
        assert (ids[0], ids[1], ids[-1]) == AUTHORS_ENDS[name]
        assert _ids_digest(ids) == AUTHORS_SHA256[name], f"{name} ids are not the authors' split"
        # The authors' split uses the same 100 scenario numbers in all four categories on each side.
        scenarios = {c: {i.rsplit("_", 1)[1] for i in ids if category_of(i) == c} for c in CATEGORIES}
        assert all(len(s) == 100 for s in scenarios.values())
        assert len({frozenset(s) for s in scenarios.values()}) == 1


def test_split_digest_detects_an_edit():
    ours = json.loads((DATA / "bfcl_split.json").read_text())
    swapped = list(ours["train"])
    swapped[0], swapped[1] = swapped[1], swapped[0]  # same ids, another order
    assert _ids_digest(swapped) != AUTHORS_SHA256["train"]


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

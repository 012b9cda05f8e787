"""Writers for synthetic run and evaluation directories (docs/run_directory.md), for the report tests.

The numbers these write are chosen by the test (counts of correct tasks, tag plans); the summaries are
computed here with the textbook formulas, independently of ``seal.eval.results`` and ``seal.eval.stats``, so
a test can compare the code under test against hand-computed values.
"""

from __future__ import annotations

import importlib.util
import json
import math
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

from env_service.vocab import CATEGORIES

REPO = Path(__file__).resolve().parent.parent


def load_script(name: str) -> ModuleType:
    """Import ``scripts/<name>.py`` by path (a site-packages ``scripts`` package may shadow ours)."""
    spec = importlib.util.spec_from_file_location(f"seal_script_{name}", REPO / "scripts" / f"{name}.py")
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load scripts/{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses of the script look their module up while it executes
    spec.loader.exec_module(module)
    return module


# A failing task has two turns: a passed one, then this tag / label (unless a plan says otherwise).
DEFAULT_FAIL_TAG = "state_mismatch"
DEFAULT_FAIL_LABEL = "state_mismatch"


def eval_records(
    correct: Mapping[str, int],
    n: int | Mapping[str, int] = 100,
    fail_tags: Mapping[str, str] | None = None,
    fail_labels: Mapping[str, str] | None = None,
) -> list[dict[str, Any]]:
    """``results.jsonl`` records: per category, ``n`` tasks of which the first ``correct[c]`` succeed.

    Every task has two turns. A correct task is tagged ``[pass, pass]``; a failing one ``[pass, <tag>]``
    with ``fail_tags[c]`` (default ``state_mismatch``), and likewise for paper labels.
    """
    records = []
    for category, k in correct.items():
        size = n[category] if isinstance(n, Mapping) else n
        if not 0 <= k <= size:
            raise ValueError(f"{category}: {k} correct out of {size}")
        tag = (fail_tags or {}).get(category, DEFAULT_FAIL_TAG)
        label = (fail_labels or {}).get(category, DEFAULT_FAIL_LABEL)
        for i in range(size):
            ok = i < k
            records.append(
                {
                    "task_id": f"{category}_{i}",
                    "category": category,
                    "accuracy": 1 if ok else 0,
                    "progress": 1.0 if ok else 0.5,
                    "failure_tags": ["pass", "pass"] if ok else ["pass", tag],
                    "paper_labels": ["pass", "pass"] if ok else ["pass", label],
                    "num_model_calls": 3,
                    "messages": [],
                    "error": None,
                }
            )
    return records


BFCL_V4_QUESTIONS = {"memory_kv": 155, "memory_rec_sum": 155, "memory_vector": 155, "web_search_base": 100,
                     "web_search_no_snippet": 100}
BFCL_V4_SUBCATEGORIES = {"memory": ("memory_kv", "memory_rec_sum", "memory_vector"),
                         "web_search": ("web_search_base", "web_search_no_snippet")}


def summary_of(
    correct: Mapping[str, int], n: int | Mapping[str, int] = 100, split: str = "eval"
) -> dict[str, Any]:
    """The ``summary.json`` for :func:`eval_records` (same counts), computed with the textbook formulas."""
    accuracy: dict[str, float] = {}
    stderr: dict[str, float] = {}
    count: dict[str, int] = {}
    for category, k in correct.items():
        size = n[category] if isinstance(n, Mapping) else n
        p = k / size
        accuracy[category] = p
        stderr[category] = math.sqrt(p * (1 - p) / size)
        count[category] = size
    if set(correct) == set(CATEGORIES):
        accuracy["average"] = sum(accuracy[c] for c in CATEGORIES) / 4
        stderr["average"] = math.sqrt(sum(stderr[c] ** 2 for c in CATEGORIES)) / 4
    # a complete BFCL V4 run: every one of BFCL's sub-categories of a key (here all at the key's accuracy)
    # and with BFCL's number of questions in each (seal.report.tables.BFCL_V4_QUESTIONS)
    breakdown = {sub: {"accuracy": accuracy[key], "count": BFCL_V4_QUESTIONS[sub]}
                 for key, subs in BFCL_V4_SUBCATEGORIES.items() if key in accuracy for sub in subs}
    return {
        "policy": "synthetic",
        "split": split,
        "n": sum(count.values()),
        "accuracy": accuracy,
        "stderr": stderr,
        "count": count,
        **({"breakdown": breakdown} if breakdown else {}),
        "tag_counts": {},
        "label_counts": {},
        "wall_s": 0.0,
        "notes": ["synthetic"],
    }


def write_eval_dir(
    path: Path,
    correct: Mapping[str, int],
    n: int | Mapping[str, int] = 100,
    *,
    results: bool = True,
    summary: bool = True,
    fail_tags: Mapping[str, str] | None = None,
    fail_labels: Mapping[str, str] | None = None,
    split: str = "eval",
) -> Path:
    """An evaluation directory with ``results.jsonl`` and/or ``summary.json``."""
    path.mkdir(parents=True, exist_ok=True)
    if results:
        lines = [json.dumps(r) for r in eval_records(correct, n, fail_tags, fail_labels)]
        (path / "results.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    if summary:
        (path / "summary.json").write_text(json.dumps(summary_of(correct, n, split)), encoding="utf-8")
    return path


def validation_line(step: int, correct: Mapping[str, int], n: int = 100) -> dict[str, Any]:
    """A ``metrics.jsonl`` validation line for the four categories (``correct[c]`` of ``n`` each)."""
    line: dict[str, Any] = {"step": step}
    for category in CATEGORIES:
        line[f"val/accuracy/{category}"] = correct[category] / n
        line[f"val/count/{category}"] = n
    line["val/accuracy/average"] = sum(correct[c] / n for c in CATEGORIES) / 4
    return line


def training_line(step: int, tag_fracs: Mapping[str, float], reward: float = 0.0) -> dict[str, Any]:
    """A ``metrics.jsonl`` training line with ``train/tag_frac/<tag>`` shares."""
    line: dict[str, Any] = {"step": step, "train/reward_mean": reward, "train/accuracy_mean": reward}
    line.update({f"train/tag_frac/{tag}": frac for tag, frac in tag_fracs.items()})
    return line


def write_run_dir(
    path: Path, lines: Sequence[Mapping[str, Any]], config: str = "experiment_name: synthetic\n"
) -> Path:
    """A run directory with ``config.yaml`` and ``metrics.jsonl`` holding ``lines`` in order."""
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.yaml").write_text(config, encoding="utf-8")
    (path / "metrics.jsonl").write_text(
        "".join(json.dumps(dict(line)) + "\n" for line in lines), encoding="utf-8"
    )
    return path

"""Golden recipes: what every `exp/*.yaml` resolves to, its warm-start cache key and the launcher's `--dry-run`.

A change to how recipes are validated must not change what they mean: this test pins, for each recipe, the fully
resolved values (`to_container`, schema key order), the warm start's `cache_key` (cached models stay valid only
while it stays byte-identical) and, for the tiny recipes and exp/SEAL.yaml, the `--dry-run` output (the checkout's
path written as `<repo>`).

A change that is meant to change them rewrites the golden files:

    SEAL_UPDATE_GOLDEN=1 python -m pytest tests/recipe/test_golden.py

and the diff of tests/recipe/golden/ shows what moved (review it before committing).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from seal.engines import warm_start as W
from seal.recipe import load_config, rollout_limits, to_container

REPO = Path(__file__).resolve().parents[2]
GOLDEN = Path(__file__).resolve().parent / "golden"
UPDATE = os.environ.get("SEAL_UPDATE_GOLDEN") == "1"
RECIPES = sorted(p.stem for p in (REPO / "exp").glob("*.yaml"))  # defaults.yaml loads on its own too
DRY_RUN_RECIPES = ("tiny_cpu", "tiny_verl_cpu", "tiny_verl_learn", "SEAL")
# cache_key reads the base model's config.json when there is one; this path has none, so the key depends only
# on the recipe (and these task ids).
BASE = Path("/nonexistent/golden-base-model")
TASKS = [SimpleNamespace(task_id="multi_turn_base_0"), SimpleNamespace(task_id="multi_turn_miss_func_1")]


def _check(path: Path, text: str) -> None:
    if UPDATE:
        path.write_text(text, encoding="utf-8")
        return
    assert path.is_file(), f"{path} missing: run with SEAL_UPDATE_GOLDEN=1 once"
    assert text == path.read_text(encoding="utf-8"), f"{path.name} changed (SEAL_UPDATE_GOLDEN=1 rewrites it)"


def resolved(name: str) -> str:
    cfg = load_config(REPO / "exp" / f"{name}.yaml")
    key = W.cache_key(BASE, TASKS, cfg.model, cfg.seal.interface, rollout_limits(cfg), cfg.seed)
    return json.dumps({"cache_key": key, "recipe": to_container(cfg)}, indent=1) + "\n"


@pytest.mark.parametrize("name", RECIPES)
def test_every_recipe_resolves_as_before(name):
    _check(GOLDEN / f"{name}.json", resolved(name))


@pytest.mark.parametrize("name", DRY_RUN_RECIPES)
def test_dry_run_prints_as_before(name):
    out = subprocess.run([sys.executable, str(REPO / "launcher.py"), "--conf", f"exp/{name}.yaml", "--dry-run"],
                         cwd=REPO, capture_output=True, text=True, timeout=300, check=False)
    assert out.returncode == 0, out.stderr[-2000:]
    _check(GOLDEN / f"dry_run_{name}.txt", out.stdout.replace(str(REPO), "<repo>"))

"""`exp/SEAL_release.yaml` renders the release's training system prompt byte for byte, on all 800 tasks.

The golden data (`golden/release_train_system_prompts.json.gz`: sha256 of every task's system prompt, and four
full texts) was produced by running the authors' release (yihaohu0118/SEAL at a0d22db) outside this repository:
its data preprocessing and `BfclEnv.get_init_state` on a training create (`rollout_mode: sample`) with the
`observation_lite` block of its `exp/SEAL.yaml`. Only the rendered text is kept here.
"""

from __future__ import annotations

import gzip
import hashlib
import json
from pathlib import Path

import pytest

from env_service.config import EpisodeConfig
from env_service.episode import Episode
from env_service.interface import annotate_tools, parse_interface, render_system_suffix
from env_service.prompts import system_prompt
from env_service.tasks import load_tasks
from seal.core.controller import SealController
from seal.recipe import EXP_DIR, load_config

GOLDEN = json.loads(gzip.decompress((Path(__file__).parent / "golden" / "release_train_system_prompts.json.gz")
                                    .read_bytes()))
TASKS = load_tasks()


def system_prompts(recipe: str) -> dict[str, str]:
    """The training system prompt of every task under the recipe's Ω_0, composed as `Episode.initial_messages`
    composes it (the same three functions; building 800 episodes would load 800 BFCL scenarios for nothing —
    `test_episode_renders_the_same` checks the composition on one task per category)."""
    interface = parse_interface(SealController(load_config(str(EXP_DIR / f"{recipe}.yaml")).seal).interface("train"))
    suffix = render_system_suffix(interface)
    return {tid: system_prompt(annotate_tools(TASKS[tid].tools, interface.schema), suffix) for tid in GOLDEN["sha256"]}


@pytest.fixture(scope="module")
def release_prompts() -> dict[str, str]:
    return system_prompts("SEAL_release")


def test_golden_covers_every_task():
    assert len(GOLDEN["sha256"]) == 800 and set(GOLDEN["sha256"]) == set(TASKS)


def test_release_recipe_renders_the_release_prompt_on_all_tasks(release_prompts):
    differing = [tid for tid, text in release_prompts.items()
                 if hashlib.sha256(text.encode("utf-8")).hexdigest() != GOLDEN["sha256"][tid]]
    assert differing == [], f"{len(differing)} of 800 differ, e.g. {differing[:3]}"
    for tid, text in GOLDEN["full"].items():
        assert release_prompts[tid] == text


def test_our_wording_is_not_the_release_prompt(release_prompts):
    # the check can fail: SEAL.yaml's interface (our markers, text enums, our instruction) renders differently
    ours = system_prompts("SEAL")
    same = sum(ours[t] == release_prompts[t] for t in ours)
    assert same == 0


def test_episode_renders_the_same(release_prompts):
    interface = parse_interface(SealController(load_config(str(EXP_DIR / "SEAL_release.yaml")).seal).interface("train"))
    for tid, text in GOLDEN["full"].items():
        assert Episode("r", TASKS[tid], "train", interface, EpisodeConfig()).initial_messages()[0]["content"] == text

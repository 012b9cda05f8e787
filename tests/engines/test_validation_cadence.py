"""`trainer.test_freq` means the same in both engines (docs/config.md): every N steps and at the last one, 0 = the
last step only, -1 = never. The local engine asks `seal.recipe.validates_at`; the verl engine gives verl the
frequency `seal.engines.verl.config.verl_test_freq` maps it to, and verl's own fit loop decides."""

from __future__ import annotations

import inspect
import re

import pytest

from seal.recipe import REPO_ROOT, load_config, validates_at

TOTAL = 7
EXPECTED = {-1: set(), 0: {TOTAL}, 1: set(range(1, TOTAL + 1)), 3: {3, 6, TOTAL}, 10: {TOTAL}}


@pytest.mark.parametrize("freq", sorted(EXPECTED))
def test_the_local_rule(freq):
    assert {s for s in range(1, TOTAL + 1) if validates_at(freq, s, s == TOTAL)} == EXPECTED[freq]


def test_below_never_is_refused():
    with pytest.raises(ValueError, match="test_freq"):
        validates_at(-2, 1, False)
    from seal.recipe import ConfigError

    with pytest.raises((ConfigError, ValueError), match="test_freq"):
        load_config(REPO_ROOT / "exp" / "tiny_cpu.yaml", ["trainer.test_freq=-2"])


@pytest.mark.parametrize("freq", sorted(EXPECTED))
def test_verl_validates_at_the_same_steps(tmp_path, freq):
    """verl's fit loop validates when `test_freq > 0 and (is_last_step or global_steps % test_freq == 0)`; the
    condition is read from verl's source (so a verl upgrade that changes it fails here), then evaluated on the
    frequency our config gives verl."""
    pytest.importorskip("verl")
    from verl.trainer.ppo.v1.trainer_base import PPOTrainer

    from seal.engines.verl.config import to_verl_config

    source = re.sub(r"\s+", " ", inspect.getsource(PPOTrainer.fit))
    assert ("if self.config.trainer.test_freq > 0 and ( is_last_step or self.global_steps % "
            "self.config.trainer.test_freq == 0 )") in source
    verl_freq = to_verl_config(load_config(REPO_ROOT / "exp" / "SEAL.yaml", [f"trainer.test_freq={freq}"]),
                               tmp_path / "run").trainer.test_freq
    steps = {s for s in range(1, TOTAL + 1) if verl_freq > 0 and (s == TOTAL or s % verl_freq == 0)}
    assert steps == EXPECTED[freq]


def test_the_local_engine_asks_the_shared_rule():
    """The local engine's step decides with `validates_at` (its test_freq 0 never validated before)."""
    from seal.engines.local import engine

    assert "C.validates_at(test_freq, step, last)" in inspect.getsource(engine.training_step)

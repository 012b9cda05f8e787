"""The recipe holds every rule of the episode limits: a recipe that loads never fails at its first episode.

The engines build ``seal.rollout.types.RolloutLimits`` from a validated recipe (``seal.recipe.derived.rollout_limits``)
and check nothing again, so the rules are the recipe's alone: a model call needs room for its prompt, the
observation cut keeps a 100-token margin, and the whole sequence fits the context. This test states what an
episode needs (``episode_needs``) independently of the schema and checks that the recipe refuses exactly what breaks
it.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from seal.recipe import EXP_DIR, load_config, replaced
from seal.recipe.derived import rollout_limits, sampling_params
from seal.recipe.schema import ConfigError

BASE = load_config(str(EXP_DIR / "SEAL.yaml"))


def _with(**rollout) -> object:
    # The copied section is validated by the recipe's `replaced`, so its problems are named by their whole key.
    return replaced(BASE, rollout=BASE.rollout.model_copy(update=rollout))


def episode_needs(limits) -> bool:
    """What the agent loop (seal.rollout.episode) needs of its limits."""
    positive = all(getattr(limits, k) >= 1 for k in ("max_prompt_length", "max_response_length", "max_model_len",
                                                     "max_tokens_per_call", "max_model_calls"))
    cut = limits.max_observation_tokens is None or limits.max_observation_tokens > 200
    fits = limits.max_prompt_length + limits.max_response_length <= limits.max_model_len
    return positive and cut and fits and limits.max_tokens_per_call < limits.max_model_len


@pytest.mark.parametrize("rollout, key", [
    ({"max_tokens_per_call": 16384, "max_model_len": 16384}, "rollout.max_tokens_per_call"),
    ({"max_observation_tokens": 200}, "rollout.max_observation_tokens"),
])
def test_a_broken_limit_is_refused_when_the_recipe_loads(rollout, key):
    with pytest.raises(ConfigError) as info:
        _with(**rollout)
    assert any(key in problem for problem in info.value.problems)


def test_the_same_rule_is_refused_through_an_override():
    with pytest.raises(ConfigError, match="rollout.max_tokens_per_call"):
        load_config(str(EXP_DIR / "SEAL.yaml"), ["rollout.max_tokens_per_call=20000"])


@settings(max_examples=300, deadline=None)
@given(max_model_len=st.integers(1, 40000), max_tokens_per_call=st.integers(1, 40000),
       max_observation_tokens=st.one_of(st.none(), st.integers(1, 5000)),
       max_prompt_length=st.integers(1, 20000), max_response_length=st.integers(1, 20000),
       max_model_calls=st.integers(1, 100))
def test_a_recipe_that_loads_builds_its_episode_limits(max_model_len, max_tokens_per_call, max_observation_tokens,
                                                      max_prompt_length, max_response_length, max_model_calls):
    data = {"max_prompt_length": max_prompt_length, "max_response_length": max_response_length}
    rollout = {"max_model_len": max_model_len, "max_tokens_per_call": max_tokens_per_call,
               "max_observation_tokens": max_observation_tokens, "max_model_calls": max_model_calls}
    wanted = episode_needs(type(rollout_limits(BASE))(**data, **rollout))
    try:
        data_part, rollout_part = BASE.data.model_copy(update=data), BASE.rollout.model_copy(update=rollout)
        cfg = replaced(BASE, data=data_part, rollout=rollout_part)  # validates the copied parts too
    except ConfigError:
        assert not wanted  # refused at load time, with the keys named, only when an episode could not run
        return
    assert wanted and episode_needs(rollout_limits(cfg))  # a recipe that loads runs its episodes
    for mode in ("train", "val"):
        sampling_params(cfg, mode, seed=1)

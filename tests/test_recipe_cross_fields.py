"""The recipe check holds every rule of the episode limits: a recipe that loads never fails at its first episode.

The rules come from ``seal.rollout.types.RolloutLimits`` (what the engines build from the recipe,
``seal.recipe.derived.rollout_limits``): a model call needs room for its prompt, and the observation cut keeps a
100-token margin. Each was checked only inside a worker before.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from seal.recipe import EXP_DIR, load_config
from seal.recipe.derived import rollout_limits, sampling_params
from seal.recipe.schema import ConfigError

BASE = load_config(str(EXP_DIR / "SEAL.yaml"))


def _with(**rollout) -> object:
    return replace(BASE, rollout=replace(BASE.rollout, **rollout))


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
    try:
        cfg = replace(BASE, data=replace(BASE.data, max_prompt_length=max_prompt_length,
                                         max_response_length=max_response_length),
                      rollout=replace(BASE.rollout, max_model_len=max_model_len,
                                      max_tokens_per_call=max_tokens_per_call,
                                      max_observation_tokens=max_observation_tokens,
                                      max_model_calls=max_model_calls))
    except ConfigError:
        return  # refused at load time, with the keys named: nothing can fail later
    rollout_limits(cfg)  # what each episode builds (raises on a rule the recipe check missed)
    for mode in ("train", "val"):
        sampling_params(cfg, mode, seed=1)

"""The verl engine keeps every validation episode's token ids (`<run>/validation/step_<N>.jsonl`), and
`seal.eval.same_tokens` reads them for the check against `seal-eval --policy vllm:` that the verl learning test
runs inside its launch. The pieces, without a launch: the agent loop's output carries an evaluation episode's
tokens through verl's `reward_extra_info` (verl's own validation metrics skip it), the trainer writes them, the
helper reads them back with the run's vLLM settings, and the comparison names the first difference."""

from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np
import pytest

pytest.importorskip("verl")

from omegaconf import OmegaConf  # noqa: E402

from seal.engines.verl.agent_loop import (  # noqa: E402
    EPISODE_TOKENS_KEY,
    rollout_to_output,
    validation_records,  # noqa: E402
)
from seal.engines.verl.config import to_verl_config  # noqa: E402
from seal.engines.verl.trainer import write_validation_tokens  # noqa: E402
from seal.eval.same_tokens import (  # noqa: E402
    compare_tokens,
    run_validation_episode,
    run_vllm_settings,
    validation_steps,
)
from seal.models.qwen25 import EOS_TOKEN_ID  # noqa: E402
from seal.recipe import load_config  # noqa: E402
from seal.rollout.types import Rollout  # noqa: E402
from seal.run_dir import RunDir  # noqa: E402


def episode(task, mode, reward=1.0, excluded=False):
    if excluded:
        return Rollout(task_id=task, mode=mode, excluded=True, exclude_reason="infrastructure",
                       category=task.rsplit("_", 1)[0])
    return Rollout(task_id=task, mode=mode, prompt_ids=[1, 2, 3], response_ids=[10, 11, 12, EOS_TOKEN_ID],
                   response_mask=[1, 0, 1, 1], response_logprobs=[-0.1] * 4, reward=reward, accuracy=reward,
                   failure_tags=["pass"], paper_labels=["pass"], category=task.rsplit("_", 1)[0])


def output(rollout):
    return rollout_to_output(rollout, eos_id=EOS_TOKEN_ID, fallback_prompt_ids=[7], need_logprobs=True,
                             global_steps={"min_global_steps": 1, "max_global_steps": 1})


def test_an_evaluation_episode_carries_its_tokens_and_a_training_one_does_not():
    info = output(episode("multi_turn_base_1", "eval")).extra_fields["reward_extra_info"]
    assert json.loads(info[EPISODE_TOKENS_KEY]) == {"prompt_ids": [1, 2, 3], "response_ids": [10, 11, 12, EOS_TOKEN_ID],
                                                    "response_mask": [1, 0, 1, 1]}
    assert EPISODE_TOKENS_KEY not in output(episode("multi_turn_base_1", "train")).extra_fields["reward_extra_info"]
    lost = output(episode("multi_turn_base_1", "eval", excluded=True)).extra_fields["reward_extra_info"]
    assert EPISODE_TOKENS_KEY not in lost  # a placeholder is no episode


def test_verls_validation_metrics_skip_the_tokens():
    from verl.trainer.ppo.metric_utils import process_validation_metrics

    infos = [output(episode(t, "eval", r)).extra_fields["reward_extra_info"]
             for t, r in (("multi_turn_base_1", 1.0), ("multi_turn_base_1", 0.0))]
    merged = {k: [i[k] for i in infos] for k in infos[0]}
    metrics = process_validation_metrics(["multi_turn_base"] * 2, ["u", "u"], merged)
    assert "acc" in metrics["multi_turn_base"] and EPISODE_TOKENS_KEY not in metrics["multi_turn_base"]


def test_the_run_keeps_the_tokens_and_the_helper_reads_them(tmp_path):
    # verl's per-sample lists as `_val_metrics_update` gets them: two episodes, the second lost (no extras)
    first = output(episode("multi_turn_base_1", "eval")).extra_fields["reward_extra_info"]
    infos = {"acc": [1.0, None], "category": ["multi_turn_base", None], "task_id": ["multi_turn_base_1", None],
             "excluded": [0.0, None], EPISODE_TOKENS_KEY: [first[EPISODE_TOKENS_KEY], None]}
    records = validation_records(["multi_turn_base", "multi_turn_miss_func"], ["u1", "u2"], infos,
                                 {("multi_turn_base", "u1"): 1, ("multi_turn_miss_func", "u2"): 2})
    run = RunDir(tmp_path)
    write_validation_tokens(run.validation_file(3), records, infos)
    lines = [json.loads(x) for x in run.validation_file(3).read_text().splitlines()]
    assert len(lines) == 3 and lines[0]["response_ids"] == [10, 11, 12, EOS_TOKEN_ID]
    assert lines[1]["response_ids"] is None and lines[2]["excluded"] is True  # the session verl never got
    assert validation_steps(tmp_path) == [3]
    got = run_validation_episode(tmp_path)
    assert got["step"] == 3 and got["task_id"] == "multi_turn_base_1" and got["prompt_ids"] == [1, 2, 3]
    with pytest.raises(LookupError, match="multi_turn_miss_func_2"):
        run_validation_episode(tmp_path, task_id="multi_turn_miss_func_2")
    with pytest.raises(FileNotFoundError):
        run_validation_episode(tmp_path / "nowhere")


def test_the_helper_takes_the_runs_vllm_settings(tmp_path):
    recipe = load_config("exp/tiny_verl_learn.yaml")
    OmegaConf.save(to_verl_config(recipe, tmp_path), RunDir(tmp_path).verl_config_file)
    settings = run_vllm_settings(tmp_path)
    assert settings["max_model_len"] == recipe.rollout.max_model_len
    assert settings["gpu_memory_utilization"] == recipe.rollout.gpu_memory_utilization
    assert settings["dtype"] in ("float32", "bfloat16", "float16")


def test_compare_names_the_first_difference():
    run = {"task_id": "t", "step": 3, "prompt_ids": [1, 2], "response_ids": [5, 6, 7], "response_mask": [1, 0, 1]}
    same = SimpleNamespace(prompt_ids=[1, 2], response_ids=np.array([5, 6, 7]).tolist(), response_mask=[1, 0, 1])
    assert compare_tokens(run, same)["same"] is True
    assert compare_tokens(run, SimpleNamespace(prompt_ids=[1, 2], response_ids=[5, 9, 7],
                                               response_mask=[1, 0, 1]))["first_difference"] == 1
    assert compare_tokens(run, SimpleNamespace(prompt_ids=[1, 2], response_ids=[5, 6],
                                               response_mask=[1, 0]))["first_difference"] == 2
    assert compare_tokens(run, SimpleNamespace(prompt_ids=[1], response_ids=[5, 6, 7],
                                               response_mask=[1, 0, 1]))["first_difference"] == "prompt"

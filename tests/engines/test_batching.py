"""Rollouts -> DataProto layout and GRPO advantages (verl's implementation, release semantics)."""

from __future__ import annotations

import math

import pytest
import torch

from seal.engines.batching import compute_grpo_advantages, group_uids, rollouts_to_dataproto
from seal.rollout.types import Rollout

PAD = 151643


def rollout(task: str, prompt: list[int], response: list[int], mask: list[int], reward: float,
            tags=("pass",), logprobs=None) -> Rollout:
    return Rollout(task_id=task, mode="train", prompt_ids=prompt, response_ids=response, response_mask=mask,
                   reward=reward, accuracy=reward, category=task.rsplit("_", 1)[0], failure_tags=list(tags),
                   paper_labels=["pass"] * len(tags), response_logprobs=logprobs)


def test_layout_padding_masks_and_scores():
    rs = [rollout("multi_turn_base_1", [11, 12, 13], [21, 22, 23, 24], [1, 1, 0, 1], 1.0, ("pass", "pass")),
          rollout("multi_turn_base_1", [11, 12], [31, 32], [1, 1], 0.0, ("state_mismatch", "pass")),
          rollout("multi_turn_miss_func_2", [5], [41, 42, 43], [1, 0, 1], 0.5, ("spurious_tool_call",))]
    d = rollouts_to_dataproto(rs, PAD)
    b = d.batch
    assert b["prompts"].tolist() == [[11, 12, 13], [PAD, 11, 12], [PAD, PAD, 5]]  # left-padded
    assert b["responses"].tolist() == [[21, 22, 23, 24], [31, 32, PAD, PAD], [41, 42, 43, PAD]]  # right-padded
    assert torch.equal(b["input_ids"], torch.cat([b["prompts"], b["responses"]], 1))
    assert b["attention_mask"].tolist() == [[1] * 7, [0, 1, 1, 1, 1, 0, 0], [0, 0, 1, 1, 1, 1, 0]]
    assert b["position_ids"][1].tolist()[1:5] == [0, 1, 2, 3]  # positions count real tokens only
    assert b["position_ids"][2].tolist()[2:6] == [0, 1, 2, 3]
    assert b["response_mask"].tolist() == [[1, 1, 0, 1], [1, 1, 0, 0], [1, 0, 1, 0]]
    # The reward sits on the last real response token.
    assert b["token_level_scores"].tolist() == [[0, 0, 0, 1.0], [0, 0.0, 0, 0], [0, 0, 0.5, 0]]
    assert torch.equal(b["token_level_rewards"], b["token_level_scores"])
    assert "rollout_log_probs" not in b.keys()  # noqa: SIM118 - TensorDict membership needs keys()
    nt = d.non_tensor_batch
    assert nt["uid"].tolist() == ["multi_turn_base_1", "multi_turn_base_1", "multi_turn_miss_func_2"]
    # Equal-length tag lists stay one list per row (not a 2-D array).
    assert nt["failure_tags"].shape == (3,) and nt["failure_tags"][1] == ["state_mismatch", "pass"]
    assert nt["paper_labels"][2] == ["pass"] and nt["category"][2] == "multi_turn_miss_func"


def test_fixed_lengths_logprobs_and_refusals():
    rs = [rollout("multi_turn_base_1", [1, 2], [3, 4], [1, 1], 1.0, logprobs=[-0.5, -0.25]),
          rollout("multi_turn_base_1", [1], [5], [1], 0.0, logprobs=[-1.0])]
    d = rollouts_to_dataproto(rs, PAD, prompt_length=4, response_length=5, uids=["a", "a"])
    assert d.batch["prompts"].shape == (2, 4) and d.batch["responses"].shape == (2, 5)
    assert d.batch["rollout_log_probs"][0].tolist() == [-0.5, -0.25, 0, 0, 0]
    with pytest.raises(ValueError, match="shorter"):
        rollouts_to_dataproto(rs, PAD, response_length=1)
    excluded = Rollout(task_id="multi_turn_base_9", mode="train", excluded=True, exclude_reason="infrastructure")
    with pytest.raises(ValueError, match="excluded"):
        rollouts_to_dataproto([excluded], PAD)
    with pytest.raises(ValueError, match="no rollouts"):
        rollouts_to_dataproto([], PAD)
    assert group_uids(rs, step=3) == ["3:multi_turn_base_1", "3:multi_turn_base_1"]


def test_grpo_matches_release_formula():
    # Group a: rewards 1, 0, 0 -> mean 1/3, unbiased std sqrt(1/3); group b: a singleton (score - 0) / 1.
    rs = [rollout("multi_turn_base_1", [1], [2, 3], [1, 1], 1.0),
          rollout("multi_turn_base_1", [1], [2, 3, 4], [1, 0, 1], 0.0),
          rollout("multi_turn_base_1", [1], [2], [1], 0.0),
          rollout("multi_turn_base_7", [1], [9], [1], 1.0)]
    d = rollouts_to_dataproto(rs, PAD)
    compute_grpo_advantages(d)
    std = math.sqrt(((2 / 3) ** 2 + 2 * (1 / 3) ** 2) / 2)
    hi, lo = (1 - 1 / 3) / (std + 1e-6), (0 - 1 / 3) / (std + 1e-6)
    adv = d.batch["advantages"]
    assert adv[0].tolist() == pytest.approx([hi, hi, 0], rel=1e-5)
    assert adv[1].tolist() == pytest.approx([lo, 0, lo], rel=1e-5)  # zero off the response mask
    assert adv[2].tolist() == pytest.approx([lo, 0, 0], rel=1e-5)
    assert adv[3].tolist() == pytest.approx([1 / (1 + 1e-6), 0, 0], rel=1e-5)
    assert torch.equal(d.batch["returns"], adv)
    # Without std normalisation (Dr.GRPO switch): plain centring.
    d2 = rollouts_to_dataproto(rs, PAD)
    compute_grpo_advantages(d2, norm_adv_by_std_in_grpo=False)
    assert d2.batch["advantages"][0, 0].item() == pytest.approx(2 / 3)

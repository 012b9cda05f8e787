"""Rollouts -> verl `DataProto` (shared by both engines) and GRPO advantages through verl's own code.

Layout of the batch built by `rollouts_to_dataproto` for B rollouts, P = longest prompt, R = longest
response (or the fixed lengths passed in)::

    prompts            [B, P]    left-padded with pad_id
    responses          [B, R]    right-padded with pad_id
    input_ids          [B, P+R]  prompts ++ responses
    attention_mask     [B, P+R]  1 on real tokens (prompt and response), 0 on padding
    position_ids       [B, P+R]  cumsum(attention_mask) - 1, clipped at 0 (verl's convention)
    response_mask      [B, R]    1 on tokens the model sampled, 0 on observation tokens and padding
    token_level_scores [B, R]    the rollout's reward on its last response token, 0 elsewhere
    token_level_rewards[B, R]    = token_level_scores (no KL in the reward: paper / release)
    rollout_log_probs  [B, R]    only when every rollout carries sampling log-probs

non_tensor_batch (object arrays, one entry per row): `uid` (one id per task group: GRPO's index),
`interface_version`, and the episode records' columns (`seal.core.record.record_columns`: `task_id`,
`category`, `failure_tags` and `paper_labels` (lists of str), `excluded`), as the verl engine builds them too.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from seal.core.record import object_array, record_columns
from seal.rollout.types import Rollout

# The release's GRPO: unbiased std, eps 1e-6; verl's implementation is the same.
GRPO_EPSILON = 1e-6


def group_uids(rollouts: Sequence[Rollout], step: int | None = None) -> list[str]:
    """One uid per task in the batch: all rollouts of a task share it (GRPO groups)."""
    prefix = "" if step is None else f"{step}:"
    return [f"{prefix}{r.task_id}" for r in rollouts]


def rollouts_to_dataproto(
    rollouts: Sequence[Rollout],
    pad_id: int,
    *,
    uids: Sequence[str] | None = None,
    prompt_length: int | None = None,
    response_length: int | None = None,
):
    """Stack non-excluded rollouts into a verl `DataProto` (layout in the module docstring).

    `uids` default to `group_uids(rollouts)`. `prompt_length` / `response_length` pad to a fixed
    size (must be >= the longest sequence); by default the batch maxima are used (at least 1).
    Excluded rollouts are refused: they carry no trainable sequence (drop them first).
    """
    from verl import DataProto

    if not rollouts:
        raise ValueError("no rollouts to batch")
    bad = [r.task_id for r in rollouts if r.excluded]
    if bad:
        raise ValueError(f"excluded rollouts cannot be trained on: {bad[:5]}")
    for r in rollouts:
        if len(r.response_mask) != len(r.response_ids):
            raise ValueError(f"{r.task_id}: response_mask and response_ids differ in length")
    uids = list(uids) if uids is not None else group_uids(rollouts)
    if len(uids) != len(rollouts):
        raise ValueError(f"{len(uids)} uids for {len(rollouts)} rollouts")
    p_max = max(len(r.prompt_ids) for r in rollouts)
    r_max = max(1, max(len(r.response_ids) for r in rollouts))
    p_len = p_max if prompt_length is None else int(prompt_length)
    r_len = r_max if response_length is None else int(response_length)
    if p_len < p_max or r_len < r_max:
        raise ValueError(f"fixed lengths ({p_len}, {r_len}) are shorter than the batch's ({p_max}, {r_max})")
    bsz = len(rollouts)
    prompts = torch.full((bsz, p_len), pad_id, dtype=torch.long)
    responses = torch.full((bsz, r_len), pad_id, dtype=torch.long)
    prompt_attn = torch.zeros((bsz, p_len), dtype=torch.long)
    resp_attn = torch.zeros((bsz, r_len), dtype=torch.long)
    response_mask = torch.zeros((bsz, r_len), dtype=torch.long)
    scores = torch.zeros((bsz, r_len), dtype=torch.float32)
    with_logprobs = all(r.response_logprobs is not None for r in rollouts)
    logprobs = torch.zeros((bsz, r_len), dtype=torch.float32) if with_logprobs else None
    for i, r in enumerate(rollouts):
        lp, lr = len(r.prompt_ids), len(r.response_ids)
        if lp:
            prompts[i, p_len - lp:] = torch.tensor(r.prompt_ids, dtype=torch.long)
            prompt_attn[i, p_len - lp:] = 1
        if lr:
            responses[i, :lr] = torch.tensor(r.response_ids, dtype=torch.long)
            resp_attn[i, :lr] = 1
            response_mask[i, :lr] = torch.tensor(r.response_mask, dtype=torch.long)
            if logprobs is not None:
                logprobs[i, :lr] = torch.tensor(r.response_logprobs[:lr], dtype=torch.float32)
        # Release: the outcome goes on the last attended response position (index 0 for an empty
        # response, whose row is fully masked; GRPO sums the row, so the score still counts).
        scores[i, max(lr - 1, 0)] = float(r.reward)
    attention_mask = torch.cat([prompt_attn, resp_attn], dim=1)
    position_ids = torch.clamp(torch.cumsum(attention_mask, dim=1) - 1, min=0)
    tensors = {
        "prompts": prompts,
        "responses": responses,
        "input_ids": torch.cat([prompts, responses], dim=1),
        "attention_mask": attention_mask,
        "position_ids": position_ids,
        "response_mask": response_mask,
        "token_level_scores": scores,
        "token_level_rewards": scores.clone(),
    }
    if logprobs is not None:
        tensors["rollout_log_probs"] = logprobs
    non_tensors = {
        "uid": object_array(uids),
        "interface_version": object_array([r.interface_version for r in rollouts]),
        **record_columns([r.record() for r in rollouts]),
    }
    return DataProto.from_dict(tensors=tensors, non_tensors=non_tensors)


def compute_grpo_advantages(data, norm_adv_by_std_in_grpo: bool = True, epsilon: float = GRPO_EPSILON) -> None:
    """GRPO outcome advantages with verl's `compute_grpo_outcome_advantage`, written into
    `data.batch["advantages"]` and `data.batch["returns"]` ([bsz, r_len], zero off `response_mask`).

    Groups are the `uid` column; each group's score is standardised with its mean and unbiased std
    (+ `epsilon`); a single-member group gets (score - 0) / 1 (release and verl behaviour).
    """
    from verl.trainer.ppo.core_algos import compute_grpo_outcome_advantage

    advantages, returns = compute_grpo_outcome_advantage(
        token_level_rewards=data.batch["token_level_rewards"],
        response_mask=data.batch["response_mask"],
        index=data.non_tensor_batch["uid"],
        epsilon=epsilon,
        norm_adv_by_std_in_grpo=norm_adv_by_std_in_grpo,
    )
    data.batch["advantages"] = advantages
    data.batch["returns"] = returns


def no_learning_signal(advantages: torch.Tensor, response_mask: torch.Tensor, entropy_coeff: float) -> bool:
    """True when the policy-gradient term of the update is exactly zero: every sampled response token's
    advantage is zero (no task group has a reward spread; with an untuned model every reward is 0) and no
    entropy bonus is asked for. advantages, response_mask: [B, R].

    Both engines then skip the update whole: no forward, backward or optimizer step, so its KL term and
    AdamW's weight decay and momentum are not applied either. Peers drop zero-variance groups from the
    update the same way; verl's own trainer, without its group filter, would still take that KL-only step."""
    if entropy_coeff != 0.0:
        return False
    return not bool(advantages[response_mask.bool()].any())


# What a skipped update logs, in both engines: the flag, and the two quantities that are exactly zero on such a
# step (the policy-gradient loss: every advantage is zero; the gradient norm: no backward ran). Nothing else, so
# no engine invents a value for a quantity it did not compute (a learning rate, a KL term, a clip fraction).
SKIPPED_UPDATE_KEYS = ("actor/update_skipped", "actor/pg_loss", "actor/grad_norm")


def skipped_update_metrics() -> dict[str, float]:
    """The metrics of a step whose update was skipped (`no_learning_signal`): `SKIPPED_UPDATE_KEYS`, the flag 1
    and the policy-gradient loss and gradient norm 0. A step that updates logs `actor/update_skipped` 0."""
    return {"actor/update_skipped": 1.0, "actor/pg_loss": 0.0, "actor/grad_norm": 0.0}

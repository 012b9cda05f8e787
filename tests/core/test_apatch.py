"""A-Patch: hand-computed scales, the tensor op, a real verl DataProto, and properties (hypothesis)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from env_service.vocab import PAPER_LABELS, PROGRESS_TAGS
from seal.core.apatch import APatchConfig, apply_apatch, apply_scales, trajectory_scale
from seal.core.weights import PAPER_WEIGHTS, PROGRESS_WEIGHTS, base_weights, reply_field
from seal.recipe import ConfigError, load_config

verl = pytest.importorskip("verl")
DataProto = verl.DataProto

W = base_weights("progress")


# ------------------------------------------------------------------ trajectory_scale, by hand
@pytest.mark.parametrize(
    ("tags", "weights", "bounds", "expected"),
    [
        ([], W, (0.5, 2.0), 1.0),  # nothing to weigh
        (["pass"], W, (0.5, 2.0), 1.0),
        (["spurious_tool_call", "pass"], W, (0.5, 2.0), 1.5),  # (2.0 + 1.0) / 2
        (["checker_error", "gt_error"], W, (0.5, 2.0), 1.0),  # only excluded tags -> untouched
        (["empty_turn_model_response", "checker_error"], W, (0.5, 2.0), 1.5),  # excluded tag dropped
        (["instance_mismatch"] * 3, W, (0.5, 2.0), 0.6),
        (["instance_mismatch"], W, (0.7, 2.0), 0.7),  # clipped up to min_scale
        (["spurious_tool_call"] * 2, {"spurious_tool_call": 3.0}, (0.5, 2.0), 2.0),  # clipped to max
        (["mystery_tag"], W, (0.5, 2.0), 1.0),  # unknown tags weigh 1.0
        (["spurious_tool_call", "spurious_tool_call", "state_mismatch", "response_mismatch"], W, (0.5, 2.0),
         1.475),  # (2 + 2 + 1 + 0.9) / 4
        (["correct_abstention", "empty_turn_model_response", "pass", "gt_error"], W, (0.5, 2.0),
         1.4333333333333333),  # (1.8 + 1.5 + 1.0) / 3
        (["missing_tool_call", "argument_mismatch"], base_weights("paper"), (0.5, 2.0), 1.35),  # (1.5+1.2)/2
    ],
)
def test_trajectory_scale_table(tags, weights, bounds, expected):
    assert trajectory_scale(tags, weights, *bounds) == pytest.approx(expected, abs=1e-12)


def test_trajectory_scale_rejects_bounds_that_could_flip_signs():
    with pytest.raises(ValueError):
        trajectory_scale(["pass"], W, 0.0, 2.0)
    with pytest.raises(ValueError):
        trajectory_scale(["pass"], W, 1.2, 2.0)  # an untagged sample's 1.0 would lie outside


def test_weight_tables_match_paper_and_cover_vocabularies():
    assert PROGRESS_WEIGHTS == {
        "spurious_tool_call": 2.0, "correct_abstention": 1.8, "empty_turn_model_response": 1.5,
        "state_mismatch": 1.0, "response_mismatch": 0.9, "instance_mismatch": 0.6, "pass": 1.0,
    }
    # budget_exceeded (ours, env_service/budget.py) is not in the paper's table: it gets DEFAULT_WEIGHT
    assert set(PROGRESS_WEIGHTS) == set(PROGRESS_TAGS) - {"checker_error", "gt_error", "budget_exceeded"}
    assert set(PAPER_WEIGHTS) == set(PAPER_LABELS)
    assert all(0.5 <= w <= 2.0 for w in PAPER_WEIGHTS.values())
    assert reply_field("progress") == "failure_tags" and reply_field("paper") == "paper_labels"
    base_weights("progress")["pass"] = 5.0  # a copy: the table itself is unchanged
    assert PROGRESS_WEIGHTS["pass"] == 1.0


# ------------------------------------------------------------------ config
def test_config_keeps_explicit_values():
    cfg = APatchConfig(warmup_steps=0, tag_weights={"pass": 0.0}, apply_to="negative")
    assert cfg.warmup_steps == 0 and cfg.tag_weights == {"pass": 0.0} and cfg.apply_to == "negative"
    # an explicit 0 weight is kept: mean 0 is then clipped to min_scale
    assert trajectory_scale(["pass", "pass"], cfg.static_weights()) == 0.5
    assert cfg.tags_column == "failure_tags"
    assert APatchConfig(vocabulary="paper").tags_column == "paper_labels"
    assert APatchConfig(tags_key="my_tags").tags_column == "my_tags"
    with pytest.raises(ValueError):
        APatchConfig(tag_weights={"not_a_tag": 1.0})
    with pytest.raises(ValueError):
        APatchConfig(vocabulary="paper", tag_weights={"spurious_tool_call": 1.0})


@pytest.mark.parametrize("override,message", [
    ("seal.apatch.warmup_step=3", "seal.apatch.warmup_step: unknown key"),
    ("seal.apatch.apply_to=both", "seal.apatch.apply_to: must be one of"),
    ("seal.apatch.min_scale=0.0", r"seal.apatch.min_scale: must lie in \(0, 1\]"),
    ("seal.apatch.max_scale=0.9", "seal.apatch.max_scale: must be >= 1"),
    ("seal.apatch.warmup_steps=-1", "seal.apatch.warmup_steps: must be >= 0"),
    ("seal.apatch.tag_weights.pass=-0.5", "seal.apatch.tag_weights.pass: must be >= 0"),
])
def test_recipe_refuses_bad_apatch_knobs(override, message):
    # The knobs' declared ranges are checked where a run's config is built: the recipe.
    with pytest.raises(ConfigError, match=message):
        load_config(None, [override])


def test_config_from_a_recipe():
    cfg = load_config(None, ["seal.apatch.tag_weights.state_mismatch=1.4"]).seal.apatch_config
    assert cfg.static_weights()["state_mismatch"] == 1.4
    assert cfg.static_weights()["spurious_tool_call"] == 2.0


# ------------------------------------------------------------------ apply_scales, by hand
def test_apply_scales_by_hand():
    adv = torch.tensor([[0.5, 0.5, -7.0], [-1.0, -1.0, 3.0]])
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]])
    scales = torch.tensor([2.0, 0.5])
    assert torch.equal(apply_scales(adv, mask, scales, "all"), torch.tensor([[1.0, 1.0, -7.0], [-0.5, -0.5, 1.5]]))
    assert torch.equal(apply_scales(adv, mask, scales, "positive"), torch.tensor([[1.0, 1.0, -7.0], [-1.0, -1.0, 1.5]]))
    assert torch.equal(apply_scales(adv, mask, scales, "negative"), torch.tensor([[0.5, 0.5, -7.0], [-0.5, -0.5, 3.0]]))
    assert torch.equal(adv, torch.tensor([[0.5, 0.5, -7.0], [-1.0, -1.0, 3.0]]))  # input untouched


def test_apply_scales_rejects_bad_input():
    adv = torch.zeros(2, 3)
    with pytest.raises(ValueError):
        apply_scales(adv, torch.ones(2, 4), torch.ones(2))
    with pytest.raises(ValueError):
        apply_scales(adv, torch.ones(2, 3), torch.ones(3))
    with pytest.raises(ValueError):
        apply_scales(adv, torch.ones(2, 3), torch.tensor([1.0, -1.0]))
    with pytest.raises(ValueError):
        apply_scales(adv, torch.ones(2, 3), torch.ones(2), "sideways")


# ------------------------------------------------------------------ on a real DataProto
def _tags_column(rows):
    column = np.empty(len(rows), dtype=object)
    column[:] = rows
    return column


def _batch(tags_rows):
    adv = torch.tensor(
        [
            [0.5, 0.5, 0.5, 0.0, 0.0],
            [-1.0, -1.0, -1.0, -1.0, 9.0],  # 9.0 sits on padding: must stay as is
            [0.3, 0.3, 0.0, 0.0, 0.0],
            [-0.2, -0.2, -0.2, -0.2, -0.2],
        ]
    )
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 0], [1, 1, 0, 0, 0], [1, 1, 1, 1, 1]])
    return DataProto.from_dict(
        tensors={"advantages": adv, "response_mask": mask},
        non_tensors={"failure_tags": _tags_column(tags_rows)},
    )


TAG_ROWS = [
    ["spurious_tool_call", "pass"],  # 1.5
    ["instance_mismatch", "instance_mismatch", "checker_error"],  # 0.6
    None,  # no tags -> 1
    [],  # empty -> 1
]


def test_apply_apatch_on_dataproto_with_padding():
    data = _batch(TAG_ROWS)
    before = data.batch["advantages"].clone()
    metrics = apply_apatch(data, W, APatchConfig(), global_step=1)
    expected = torch.tensor(
        [
            [0.75, 0.75, 0.75, 0.0, 0.0],
            [-0.6, -0.6, -0.6, -0.6, 9.0],
            [0.3, 0.3, 0.0, 0.0, 0.0],
            [-0.2, -0.2, -0.2, -0.2, -0.2],
        ]
    )
    torch.testing.assert_close(data.batch["advantages"], expected)
    assert torch.equal(before, _batch(TAG_ROWS).batch["advantages"])
    assert metrics["apatch/scaled_count"] == 2
    assert metrics["apatch/missing_tag_count"] == 2
    assert metrics["apatch/mean_scale"] == pytest.approx((1.5 + 0.6 + 1 + 1) / 4)
    assert metrics["apatch/tag_frac/instance_mismatch"] == pytest.approx(2 / 5)
    assert metrics["apatch/tag_frac/checker_error"] == pytest.approx(1 / 5)
    assert metrics["apatch/tag_weight/spurious_tool_call"] == 2.0
    assert all(k.startswith("apatch/") for k in metrics)


def test_apply_apatch_changes_the_callers_dataproto_and_its_views():
    data = _batch(TAG_ROWS)
    view = data[:]  # shares the TensorDict with `data` (verl 0.9.1)
    apply_apatch(data, W, APatchConfig(), global_step=1)
    assert view.batch["advantages"][0, 0].item() == pytest.approx(0.75)


@pytest.mark.parametrize(("apply_to", "row0", "row1"), [("positive", 0.75, -1.0), ("negative", 0.5, -0.6)])
def test_apply_apatch_positive_negative(apply_to, row0, row1):
    data = _batch(TAG_ROWS)
    apply_apatch(data, W, APatchConfig(apply_to=apply_to), global_step=1)
    assert data.batch["advantages"][0, 0].item() == pytest.approx(row0)
    assert data.batch["advantages"][1, 0].item() == pytest.approx(row1)
    assert data.batch["advantages"][1, 4].item() == 9.0


def test_apply_apatch_warmup_disabled_and_missing_column():
    data = _batch(TAG_ROWS)
    before = data.batch["advantages"].clone()
    assert apply_apatch(data, W, APatchConfig(warmup_steps=3), global_step=2)["apatch/warmup_skipped"] == 1.0
    assert apply_apatch(data, W, APatchConfig(enable=False), global_step=5) == {"apatch/enabled": 0.0}
    assert torch.equal(data.batch["advantages"], before)
    metrics = apply_apatch(data, W, APatchConfig(tags_key="absent"), global_step=3)
    assert metrics["apatch/missing_tag_count"] == 4 and torch.equal(data.batch["advantages"], before)


def test_apply_apatch_accepts_2d_tag_array_and_rejects_strings():
    data = DataProto.from_dict(
        tensors={"advantages": torch.ones(2, 2), "response_mask": torch.ones(2, 2)},
        non_tensors={"failure_tags": np.array([["spurious_tool_call"], ["instance_mismatch"]], dtype=object)},
    )
    apply_apatch(data, W, APatchConfig(), global_step=1)
    torch.testing.assert_close(data.batch["advantages"], torch.tensor([[2.0, 2.0], [0.6, 0.6]]))
    bad = DataProto.from_dict(
        tensors={"advantages": torch.ones(2, 2), "response_mask": torch.ones(2, 2)},
        non_tensors={"failure_tags": _tags_column(["pass", ["pass"]])},
    )
    with pytest.raises(TypeError, match="sample 0"):
        apply_apatch(bad, W, APatchConfig(), global_step=1)


def test_apply_apatch_paper_vocabulary_reads_paper_labels():
    data = DataProto.from_dict(
        tensors={"advantages": torch.ones(1, 2), "response_mask": torch.ones(1, 2)},
        non_tensors={
            "failure_tags": _tags_column([["spurious_tool_call"]]),
            "paper_labels": _tags_column([["missing_tool_call"]]),
        },
    )
    cfg = APatchConfig(vocabulary="paper")
    apply_apatch(data, cfg.static_weights(), cfg, global_step=1)
    torch.testing.assert_close(data.batch["advantages"], torch.tensor([[1.5, 1.5]]))


# ------------------------------------------------------------------ properties
ALL_TAGS = sorted(set(PROGRESS_TAGS) | set(PAPER_LABELS) | {"unknown", "mystery"})
tag_lists = st.lists(st.sampled_from(ALL_TAGS), max_size=10)
any_weights = st.dictionaries(st.sampled_from(ALL_TAGS), st.floats(0.0, 10.0), max_size=len(ALL_TAGS))
bounds = st.tuples(st.floats(0.05, 1.0), st.floats(1.0, 5.0))
# float32 advantages without subnormals (a scaled subnormal may round to 0 — not a real advantage)
finite32 = st.floats(-5, 5, width=32, allow_subnormal=False)
# advantages at least 0.01 apart, so float32 rounding of s*x cannot merge two distinct values
grid_advantages = st.integers(-500, 500).map(lambda k: k / 100)


@settings(max_examples=200, deadline=None)
@given(tags=tag_lists, weights=any_weights, b=bounds)
def test_every_scale_lies_in_bounds(tags, weights, b):
    assert b[0] <= trajectory_scale(tags, weights, *b) <= b[1]


@settings(max_examples=100, deadline=None)
@given(
    data=st.data(),
    batch=st.integers(1, 6),
    length=st.integers(1, 6),
    apply_to=st.sampled_from(["all", "positive", "negative"]),
)
def test_sign_is_never_flipped(data, batch, length, apply_to):
    adv = torch.tensor(data.draw(st.lists(st.lists(finite32, min_size=length, max_size=length),
                                          min_size=batch, max_size=batch)))
    mask = torch.tensor(data.draw(st.lists(st.lists(st.booleans(), min_size=length, max_size=length),
                                           min_size=batch, max_size=batch)))
    scales = torch.tensor(data.draw(st.lists(st.floats(0.5, 2.0), min_size=batch, max_size=batch)))
    out = apply_scales(adv, mask, scales, apply_to)
    assert torch.equal(torch.sign(out), torch.sign(adv))
    assert torch.equal(out[~mask], adv[~mask])


@settings(max_examples=100, deadline=None)
@given(
    advs=st.lists(grid_advantages, min_size=2, max_size=8),
    tags=tag_lists,
    weights=any_weights,
    apply_to=st.sampled_from(["all", "positive", "negative"]),
)
def test_group_sharing_one_tag_list_keeps_its_order(advs, tags, weights, apply_to):
    # One GRPO group whose samples all carry the same tags: one scale s > 0 for all, so x -> s*x is
    # monotone and (with apply_to) still monotone; the order of the group's advantages is preserved.
    scale = trajectory_scale(tags, weights)
    adv = torch.tensor(advs).unsqueeze(-1)
    out = apply_scales(adv, torch.ones_like(adv, dtype=torch.bool), torch.full((len(advs),), scale), apply_to)
    for i in range(len(advs)):
        for j in range(len(advs)):
            if advs[i] < advs[j]:
                assert out[i, 0] < out[j, 0]


@settings(max_examples=60, deadline=None)
@given(
    groups=st.lists(
        st.lists(st.tuples(st.integers(0, 1), tag_lists), min_size=1, max_size=8), min_size=1, max_size=4
    ),
    apply_to=st.sampled_from(["all", "positive", "negative"]),
)
def test_verifier_ranking_survives_in_binary_grpo_groups(groups, apply_to):
    # With 0/1 rewards every success of a group shares one positive advantage and every failure one
    # negative advantage; A-Patch keeps the signs, so r_i > r_j still implies Â_i > Â_j.
    from verl.trainer.ppo.core_algos import compute_grpo_outcome_advantage

    rows = [(g, r, tags) for g, members in enumerate(groups) for r, tags in members]
    length = 3
    rewards = torch.zeros(len(rows), length)
    rewards[:, -1] = torch.tensor([float(r) for _, r, _ in rows])
    mask = torch.ones(len(rows), length)
    index = np.array([str(g) for g, _, _ in rows], dtype=object)
    adv, _ = compute_grpo_outcome_advantage(rewards, mask, index)
    data = DataProto.from_dict(
        tensors={"advantages": adv, "response_mask": mask},
        non_tensors={"failure_tags": _tags_column([t for _, _, t in rows]), "uid": index},
    )
    apply_apatch(data, W, APatchConfig(apply_to=apply_to), global_step=1)
    patched = data.batch["advantages"][:, 0]
    for i, (gi, ri, _) in enumerate(rows):
        for j, (gj, rj, _) in enumerate(rows):
            if gi == gj and ri > rj:
                assert patched[i] > patched[j]


def test_same_sign_order_can_change_with_dense_rewards():
    # What A-Patch does NOT promise: two positive advantages of different size (dense rewards) and
    # different tags can swap. 0.5 * 2.0 (spurious) > 0.8 * 0.6 (instance mismatch).
    adv = torch.tensor([[0.5], [0.8]])
    scales = torch.tensor([trajectory_scale(["spurious_tool_call"], W), trajectory_scale(["instance_mismatch"], W)])
    out = apply_scales(adv, torch.ones_like(adv), scales)
    assert out[0, 0] > out[1, 0]

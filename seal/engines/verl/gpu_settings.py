"""The GPU path's verl settings (`trainer.device: cuda`, the 4-GPU recipe `exp/SEAL.yaml`).

`seal.engines.verl.config.recipe_overrides` adds these for cuda, as it adds `cpu_overrides` for cpu. Why each
(docs/verl_engine.md, "The GPU path's settings"):

- **FSDP2 for the actor and the reference** (verl 0.9.1 defaults to FSDP1). The CPU path can only run FSDP2
  (verl's FSDP1 asks for a CUDA device id), so FSDP2 is the strategy CI runs through verl's own engine; verl's
  guide reports ~7% less memory with it. verl picks the strategy per role from `*.strategy` (the worker) and
  `*.fsdp_config.strategy` (the engine): all four are set.
- **Dynamic batches for the forward-only passes** (the actor's old log-probs, the reference's log-probs): verl
  packs sequences into forward calls of at most `forward_token_budget` tokens per GPU instead of one sequence a
  call. These passes compute no loss, so the batching cannot change their result (checked on CPU with verl's own
  engine: `tests/engines/test_verl_cpu_engine.py`). verl 0.9.1's actor engine has one dynamic-batch switch for
  both its forward-only pass and its update (`actor.use_dynamic_bsz` must equal
  `rollout.log_prob_use_dynamic_bsz`); the update keeps the recipe's micro-batch because the adapter's
  `_update_actor` sends `use_dynamic_bsz: false` with every update batch (`seal.engines.verl.adapter`).
"""

from __future__ import annotations

from typing import Any

from seal import recipe as C

FSDP_STRATEGY = "fsdp2"
STRATEGY_KEYS = ("actor_rollout_ref.actor.strategy", "actor_rollout_ref.ref.strategy",
                 "actor_rollout_ref.actor.fsdp_config.strategy", "actor_rollout_ref.ref.fsdp_config.strategy")
# verl's switches and token budgets of the forward-only passes (the pre-flight memory plan reads the budget here).
DYNAMIC_BSZ_KEYS = ("actor_rollout_ref.actor.use_dynamic_bsz", "actor_rollout_ref.rollout.log_prob_use_dynamic_bsz",
                    "actor_rollout_ref.ref.log_prob_use_dynamic_bsz")
FORWARD_TOKEN_BUDGET_KEYS = ("actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu",
                             "actor_rollout_ref.ref.log_prob_max_token_len_per_gpu")


def forward_token_budget(cfg: C.Recipe) -> int:
    """Tokens per GPU in one forward-only call: the longest sequence verl can hold, `data.max_prompt_length +
    data.max_response_length` (12,288 in the recipe), so every sequence fits (verl refuses one longer than the
    budget) and a call never holds more tokens than the update's micro-batch of one full-length sequence.

    Why not more (the context window, 16,384, say): one forward over N tokens holds the full logits ([N, 152,064]
    for Qwen2.5) and their log-softmax, ~1.2 MB per token in float32 on the GPU path's unfused kernel: 15 GB at
    12,288 tokens, the update's peak, which the memory plan budgets (docs/verl_engine.md, "Memory per GPU");
    16,384 would add 5 GB to the forward passes' peak and move the pre-flight's plan for them into its warning
    band on an 80 GB card. BFCL episodes run ~4-8k tokens, so a call holds 1-3 of them.
    """
    return cfg.data.max_prompt_length + cfg.data.max_response_length


def gpu_overrides(cfg: C.Recipe) -> dict[str, Any]:
    """The verl keys the GPU path sets beyond the recipe's mapping: FSDP2, and dynamic forward-only batches."""
    budget = forward_token_budget(cfg)
    return {**{key: FSDP_STRATEGY for key in STRATEGY_KEYS},
            **{key: True for key in DYNAMIC_BSZ_KEYS},
            **{key: budget for key in FORWARD_TOKEN_BUDGET_KEYS}}

"""The local engine's actor: log-probabilities of sampled tokens and the PPO/GRPO update, as tensor functions.

In the style of verl's `core_algos`: each function takes tensors (or verl's `DataProto` batch) and the
sub-config it reads, and says its shapes. The loss terms are verl's own functions (`compute_policy_loss_vanilla`
(dual-clip), `kl_penalty`, `agg_loss`), so the local update is the verl actor's update in one process.

Shapes: B rows of a batch (`seal.engines.batching.rollouts_to_dataproto`), P prompt columns (left-padded),
R response columns (right-padded); a micro-batch's tensors are trimmed to the columns some row of it uses.
"""

from __future__ import annotations

import logging
import math
from collections import Counter
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from seal.engines.batching import no_learning_signal, skipped_update_metrics
from seal.recipe import ActorConfig
from seal.rollout.hf_generation import autocast_context as _autocast

log = logging.getLogger("seal.engines.local.actor")

# Families whose CausalLM logits are exactly `lm_head(final hidden state)` (no logit scaling or soft-capping):
# for them `response_logprobs` runs the LM head on the sampled tokens only.
_PLAIN_LM_HEAD = frozenset({"qwen2", "qwen3", "llama", "mistral"})


class _LossConfig:
    """The attributes verl's `compute_policy_loss_vanilla` reads from an `ActorConfig` (its own config class
    needs Hydra's full actor tree; the policy loss reads these five)."""

    def __init__(self, clip_low: float, clip_high: float, clip_c: float, global_batch_info: dict[str, Any]):
        self.clip_ratio = clip_low
        self.clip_ratio_low = clip_low
        self.clip_ratio_high = clip_high
        self.clip_ratio_c = clip_c
        self.global_batch_info = global_batch_info

    def get(self, key: str, default: Any = None) -> Any:
        return getattr(self, key, default)


def enable_gradient_checkpointing(model: Any) -> None:
    """`actor.gradient_checkpointing`: each decoder layer's activations are recomputed in the backward pass
    instead of kept (transformers applies it in train mode only, so generation and log-prob passes are
    unchanged). Non-reentrant checkpointing: it needs no inputs that require grad and keeps RNG state."""
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})


# --------------------------------------------------------------------------- log-probabilities
def response_logprobs(model: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor, position_ids: torch.Tensor,
                      response_mask: torch.Tensor, temperature: float = 1.0, with_entropy: bool = False
                      ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-probabilities of the sampled tokens among the last R of each row under `model`.

    Args: input_ids / attention_mask / position_ids `[b, P + R]`; response_mask `[b, R]` (1 on the tokens the
    model sampled, 0 on observations and padding).
    Returns `[b, R]` log-probs (and `[b, R]` entropies when asked), 0 where response_mask is 0. Logits are
    divided by the sampling temperature first, as verl does.

    Why the LM head runs on the masked tokens only: with a 151,936-token vocabulary it is most of the cost of a
    small model, and in a BFCL episode most response tokens are tool observations (context, never a target:
    ~80% of a tiny-recipe episode). The prompt (~3-6k tokens of tool documentation) never goes through it.
    """
    response_len = response_mask.shape[1]
    targets = input_ids[:, -response_len:]
    keep = response_mask.bool()
    if getattr(model.config, "model_type", None) in _PLAIN_LM_HEAD:
        hidden = model.get_decoder()(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                                     use_cache=False).last_hidden_state
        logits = model.get_output_embeddings()(hidden[:, -response_len - 1:-1][keep]).float()  # [n, V]
    else:  # the model's own head (scaling, soft-capping) on the R positions that predict the response
        out = model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                    logits_to_keep=response_len + 1, use_cache=False)
        logits = out.logits[:, :-1, :][keep].float()
    if temperature > 0 and temperature != 1.0:
        logits = logits / temperature
    lse = torch.logsumexp(logits, dim=-1)
    logp = torch.zeros(targets.shape, dtype=logits.dtype, device=logits.device)
    logp[keep] = logits.gather(-1, targets[keep].unsqueeze(-1)).squeeze(-1) - lse
    entropy = None
    if with_entropy:
        entropy = torch.zeros_like(logp)
        entropy[keep] = lse - (torch.softmax(logits, dim=-1) * logits).sum(-1)
    return logp, entropy


def micro_batch(data: Any, rows: Sequence[int]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, int]:
    """The rows' `input_ids`, `attention_mask`, `position_ids` as `[b, p + r]`, without the columns that are
    padding in every one of them, and r (>= 1), the response columns kept: a micro-batch of short episodes
    does not pay for the batch's longest one."""
    idx = torch.as_tensor(list(rows), dtype=torch.long)
    prompts_len = data.batch["prompts"].shape[1]
    attn = data.batch["attention_mask"][idx]
    prompt_attn, resp_attn = attn[:, :prompts_len], attn[:, prompts_len:]
    lp = int(prompt_attn.sum(1).max().item())
    lr = max(1, int(resp_attn.sum(1).max().item()))
    lo, hi = prompts_len - lp, prompts_len + lr
    return data.batch["input_ids"][idx][:, lo:hi], attn[:, lo:hi], data.batch["position_ids"][idx][:, lo:hi], lr


def batch_logprobs(model: Any, data: Any, micro: int, device: torch.device, temperature: float,
                   autocast_dtype: torch.dtype | None) -> torch.Tensor:
    """`[B, R]` log-probs of every sampled response token (no grad; zero on observations and padding), computed
    `micro` rows at a time."""
    bsz, resp_len = data.batch["responses"].shape
    out = torch.zeros((bsz, resp_len), dtype=torch.float32)
    with torch.no_grad(), _autocast(device, autocast_dtype):
        for start in range(0, bsz, micro):
            rows = list(range(start, min(start + micro, bsz)))
            ids, attn, pos, lr = micro_batch(data, rows)
            mask = data.batch["response_mask"][rows, :lr].to(device)
            logp, _ = response_logprobs(model, ids.to(device), attn.to(device), pos.to(device), mask, temperature)
            out[rows[0]:rows[-1] + 1, :lr] = logp.cpu()
    return out


def rollout_logprob_check(data: Any, old_logp: torch.Tensor) -> dict[str, float]:
    """verl's check of the rollout engine against the actor (`verl.utils.debug.metrics.calculate_debug_metrics`):
    |exp(log-prob the engine sampled with) - exp(the actor's recomputed log-prob)| over the sampled response
    tokens, as `rollout/probs_diff_{max,mean,std}`. Both compute the same policy on the same tokens, so a large
    difference means stale weights in the engine or tokens that drifted. old_logp: `[B, R]` (`batch_logprobs`)."""
    from verl.utils.debug.metrics import calculate_debug_metrics

    if "rollout_log_probs" not in data.batch:
        return {}
    data.batch["old_log_probs"] = old_logp
    out = calculate_debug_metrics(data)
    if not out.get("training/rollout_probs_diff_valid"):
        return {}
    return {f"rollout/probs_diff_{stat}": float(out[f"training/rollout_probs_diff_{stat}"])
            for stat in ("max", "mean", "std")}


def advantage_abs_mean(data: Any) -> float:
    """Mean |A| over the response tokens that train (after A-Patch); advantages and response_mask `[B, R]`."""
    mask = data.batch["response_mask"]
    return float((data.batch["advantages"].abs() * mask).sum() / mask.sum().clamp(min=1))


# --------------------------------------------------------------------------- the update
def ppo_update(model: Any, ref_model: Any | None, optimizer: torch.optim.Optimizer, data: Any, actor: ActorConfig,
               *, temperature: float, train_batch_size: int, device: torch.device,
               autocast_dtype: torch.dtype | None = None, old_logp: torch.Tensor | None = None) -> dict[str, float]:
    """PPO/GRPO actor update on `data` (advantages `[B, R]` already computed and A-Patched); `old_logp`: the
    actor's `[B, R]` log-probs of `data` when already computed (`batch_logprobs`). `temperature`: the sampling
    temperature, which the log-probs divide the logits by (verl's rule).

    Mini-batches: the batch is split into train_batch_size / ppo_mini_batch_size parts (verl: one
    optimizer step per mini-batch of ppo_mini_batch_size tasks × n samples), `actor.ppo_epochs` times over.
    A step without a policy gradient (`no_learning_signal`) is skipped whole: no forward, no optimizer step.
    """
    if no_learning_signal(data.batch["advantages"], data.batch["response_mask"], actor.entropy_coeff):
        log.info("every advantage is zero (no task group has a reward spread): forward/backward skipped, no update")
        return skipped_update_metrics()
    micro = actor.ppo_micro_batch_size_per_gpu
    model.eval()
    if old_logp is None:
        old_logp = batch_logprobs(model, data, micro, device, temperature, autocast_dtype)
    ref_logp = None
    if actor.use_kl_loss and ref_model is not None:
        ref_logp = batch_logprobs(ref_model, data, micro, device, temperature, autocast_dtype)
    model.train()
    bsz = data.batch["advantages"].shape[0]
    minis = mini_batches(bsz, train_batch_size // actor.ppo_mini_batch_size)
    acc: dict[str, list[float]] = {}
    for _ in range(actor.ppo_epochs):
        for mini in minis:
            for k, v in mini_batch_step(model, optimizer, data, mini, old_logp, ref_logp, actor, temperature,
                                        device, autocast_dtype).items():
                acc.setdefault(k, []).append(v)
    model.eval()
    metrics = {k: sum(v) / len(v) for k, v in acc.items()}
    metrics["actor/lr"] = float(optimizer.param_groups[0]["lr"])
    if ref_logp is not None:
        metrics["actor/kl_coef"] = actor.kl_loss_coef
    metrics["actor/num_mini_batches"] = float(len(minis) * actor.ppo_epochs)
    metrics["actor/update_skipped"] = 0.0
    return metrics


def mini_batches(num_rows: int, parts: int) -> list[list[int]]:
    """The row indices of each mini-batch: `parts` contiguous, near-equal slices of range(num_rows) (at least
    one, at most one per row). Contiguous, so a GRPO group (consecutive rows) stays in one mini-batch when
    the sizes divide."""
    return [m.tolist() for m in np.array_split(np.arange(num_rows), max(1, min(num_rows, parts)))]


def mini_batch_step(model: Any, optimizer: torch.optim.Optimizer, data: Any, mini: list[int], old_logp: torch.Tensor,
                    ref_logp: torch.Tensor | None, actor: ActorConfig, temperature: float, device: torch.device,
                    autocast_dtype: torch.dtype | None) -> dict[str, float]:
    """One optimizer step on the rows `mini`: gradients accumulated over micro-batches of
    `actor.ppo_micro_batch_size_per_gpu` rows, each loss aggregated with the whole mini-batch's token / sequence
    count (verl's `global_batch_info`), so the sum of the micro-batch losses is the mini-batch's loss.
    old_logp, ref_logp: `[B, R]`. Returns the mini-batch's `actor/*` metrics."""
    optimizer.zero_grad(set_to_none=True)
    mask = data.batch["response_mask"].float()
    info = {"dp_size": 1, "batch_num_tokens": mask[mini].sum().clamp(min=1.0),
            "global_batch_size": max(1, int((mask[mini].sum(-1) > 0).sum()))}
    loss_cfg = _LossConfig(actor.clip_ratio_low, actor.clip_ratio_high, actor.clip_ratio_c, info)
    totals: Counter[str] = Counter()
    micro = actor.ppo_micro_batch_size_per_gpu
    for start in range(0, len(mini), micro):
        rows = mini[start:start + micro]
        ids, attn, pos, lr = micro_batch(data, rows)
        m = mask[rows, :lr].to(device)
        with _autocast(device, autocast_dtype):
            logp, entropy = response_logprobs(model, ids.to(device), attn.to(device), pos.to(device), m,
                                              temperature, with_entropy=actor.entropy_coeff != 0.0)
        ref = ref_logp[rows, :lr].to(device) if ref_logp is not None else None
        loss, terms, pg_metrics = micro_batch_loss(logp, entropy, old_logp[rows, :lr].to(device), ref,
                                                   data.batch["advantages"][rows, :lr].to(device), m, actor,
                                                   loss_cfg, info)
        totals.update(terms)  # loss terms: already parts of the mini-batch's aggregate
        for k, v in pg_metrics.items():  # verl's per-micro-batch means, weighted by rows
            totals[k] += v * len(rows) / len(mini)
        loss.backward()
    params = [p for p in model.parameters() if p.requires_grad]
    grad_norm = torch.nn.utils.clip_grad_norm_(params, actor.grad_clip if actor.grad_clip else math.inf)
    if torch.isfinite(grad_norm):
        optimizer.step()
    else:  # verl skips the step on a non-finite gradient norm
        log.warning("non-finite grad norm %s: optimizer step skipped", grad_norm)
        optimizer.zero_grad(set_to_none=True)
    out = {"actor/grad_norm": float(grad_norm)}
    out |= {k if k.startswith("actor/") else f"actor/{k}": float(v) for k, v in totals.items()}
    return out


def micro_batch_loss(logp: torch.Tensor, entropy: torch.Tensor | None, old_logp: torch.Tensor,
                     ref_logp: torch.Tensor | None, advantages: torch.Tensor, mask: torch.Tensor, actor: ActorConfig,
                     loss_cfg: _LossConfig, info: dict[str, Any]
                     ) -> tuple[torch.Tensor, dict[str, float], dict[str, float]]:
    """The actor loss of one micro-batch: clipped policy gradient - entropy_coeff · entropy + kl_loss_coef · KL
    to the reference, each aggregated by `actor.loss_agg_mode` over the mini-batch (`info`).

    logp, entropy, old_logp, ref_logp, advantages, mask: `[b, r]`. Returns the loss (with grad), its terms
    (`pg_loss`, `entropy`, `kl_loss`) and verl's policy-loss metrics (`actor/pg_clipfrac`, ...) as floats."""
    from verl.trainer.ppo.core_algos import agg_loss, compute_policy_loss_vanilla, kl_penalty

    mode = actor.loss_agg_mode
    pg_loss, pg_metrics = compute_policy_loss_vanilla(old_log_prob=old_logp, log_prob=logp, advantages=advantages,
                                                      response_mask=mask, loss_agg_mode=mode, config=loss_cfg)
    loss = pg_loss
    terms = {"pg_loss": float(pg_loss.detach())}
    if entropy is not None:
        ent = agg_loss(loss_mat=entropy, loss_mask=mask, loss_agg_mode=mode, **info)
        loss = loss - actor.entropy_coeff * ent
        terms["entropy"] = float(ent.detach())
    if ref_logp is not None:
        kl_loss = agg_loss(loss_mat=kl_penalty(logp, ref_logp, actor.kl_loss_type), loss_mask=mask,
                           loss_agg_mode=mode, **info)
        loss = loss + actor.kl_loss_coef * kl_loss
        terms["kl_loss"] = float(kl_loss.detach())
    return loss, terms, {k: float(v) for k, v in pg_metrics.items()}

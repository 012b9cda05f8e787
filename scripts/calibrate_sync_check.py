"""Measure what verl's rollout-vs-actor metrics read for a healthy and for a stale weight sync, on real BFCL episodes.

verl logs, every step, the per-token probability difference between the rollout's log-probs (vLLM) and the
actor's recomputed old log-probs: `training/rollout_probs_diff_{max,mean,std}` = max/mean/std over every
sampled response token of |exp(actor logp) - exp(rollout logp)| (verl.utils.debug.metrics.calculate_debug_metrics),
and `rollout_corr/*` (verl.trainer.ppo.rollout_corr_helper.compute_offpolicy_metrics: KL, k3 KL, χ², ...). The sync
check of `scripts/verl_gpu_smoke.sh` (`seal.engines.verl.sync_check`) judges those numbers; this script measures
them, with verl's own functions, for the two patterns the check must tell apart:

- healthy: the rollout side is a bfloat16 forward, the actor side a float32 forward of the SAME weights (on GPU
  vLLM computes in bf16 from the actor's fp32 master weights; the CPU bf16 forward stands in for vLLM's kernels);
- stale: the rollout side is a bfloat16 forward of the weights BEFORE one real optimizer update, the actor side a
  float32 forward of the weights after it (a sync that did not happen, one step behind). One update = the recipe's
  AdamW (betas, eps and weight decay of verl's defaults and the recipe) on the policy-gradient loss of the episodes
  (advantage +1, token-mean), gradient clipped at `actor.grad_clip`, at each learning rate asked for (the paper's
  is 1e-6). Also reported: the same two forwards in float32 on both sides (the update's own effect), and the share
  of weights whose bfloat16 value the update changed at all.

The episodes are real: the env service renders BFCL tasks (train mode, raw interface) and the ground-truth replies
are played through the training episode driver with SmolLM2's own tokenizer (`seal.engines.warm_start`'s
replay), so prompts, observations and masks are exactly what a training rollout holds. Tokens compared: the
episode's own sampled tokens (the ground truth), and, at the same positions, tokens drawn from the float32 model's
distribution there (closer to what on-policy sampling puts in the batch).

    python scripts/calibrate_sync_check.py --out runs/_calibration/sync_check.json

(`--tasks multi_turn_base_100 --lrs 1e-6 1e-4`, the figures in docs/verl_engine.md, took 7 minutes on a loaded
2-core machine; the default adds a 6,659-token episode and lr 1e-5, about three times as long.)

Writes one JSON object: per pattern and token set, verl's metrics plus percentiles of |Δp|.
"""

from __future__ import annotations

import argparse
import copy
import json
import time
from pathlib import Path
from typing import Any

import torch

# Two short training tasks of two categories (4-5 model calls each): the episodes are a few thousand tokens.
DEFAULT_TASKS = ("multi_turn_base_100", "multi_turn_miss_param_177")
DEFAULT_LRS = (1e-6, 1e-5, 1e-4)
PERCENTILES = (50, 90, 99, 99.9)
# The tokens compared: the episode's own sampled tokens (the ground-truth replies: what verl's response_mask
# selects); at those positions, tokens drawn from the model (what on-policy sampling would put there); and drawn
# tokens at every response position, observations included (a larger sample of real BFCL contexts for the tail).
TOKEN_SETS = ("episode", "drawn", "drawn_all_positions")


def real_episodes(tokenizer: Any, task_ids: list[str]) -> list[Any]:
    """The tasks' ground-truth episodes as training plays them (train mode, raw interface), token-exact."""
    from env_service.process import running_service
    from env_service.vocab import category_of
    from seal.engines.data import Task
    from seal.engines.warm_start import full_episode_limits, warm_start_episodes
    from seal.recipe import load_config, replaced, rollout_limits

    cfg = load_config("exp/SEAL.yaml", [])
    with running_service(["--allow-train-on-eval"]) as (url, _proc):
        env = replaced(cfg.env, urls=(url,))
        return warm_start_episodes(tokenizer, [Task(t, category_of(t)) for t in task_ids], None, env,
                                   full_episode_limits(rollout_limits(cfg)), concurrency=2, failing_twin=False)


def response_logits(model: Any, e: dict) -> torch.Tensor:
    """The model's next-token logits (float32) at every response position of episode `e`: one forward, the LM
    head on those positions only (a log-softmax in float32 follows, as vLLM's sampler and verl's actor do it)."""
    with torch.no_grad():
        hidden = model.model(input_ids=e["ids"][None]).last_hidden_state[0]
        return model.lm_head(hidden[e["all_positions"] - 1]).float()


def token_logprobs(model: Any, episodes: list[dict], draw_seed: int | None = None) -> dict[str, list[torch.Tensor]]:
    """Per token set, per episode: log p of that set's tokens (see `TOKEN_SETS`). With `draw_seed`, first draw
    the episodes' model tokens from this model's distribution at every response position (teacher-forced)."""
    gen = torch.Generator().manual_seed(draw_seed) if draw_seed is not None else None
    out: dict[str, list[torch.Tensor]] = {s: [] for s in TOKEN_SETS}
    for e in episodes:
        logp = torch.log_softmax(response_logits(model, e), -1)
        if gen is not None:
            e["drawn"] = torch.multinomial(logp.exp(), 1, generator=gen)[:, 0]
        sampled = e["sampled_mask"]  # response positions the model sampled (verl's response_mask)
        out["episode"].append(logp[sampled].gather(-1, e["ids"][e["all_positions"]][sampled][:, None])[:, 0])
        drawn = logp.gather(-1, e["drawn"][:, None])[:, 0]
        out["drawn"].append(drawn[sampled])
        out["drawn_all_positions"].append(drawn)
    return out


def one_update(model: Any, episodes: list[dict], lr: float, weight_decay: float, grad: list[torch.Tensor],
               grad_clip: float) -> Any:
    """A copy of `model` after one AdamW step with gradient `grad` (verl's optimizer: torch AdamW, betas
    (0.9, 0.999), eps 1e-8; the recipe's weight decay; gradient clipped by total norm like verl's)."""
    new = copy.deepcopy(model)
    params = [p for p in new.parameters() if p.requires_grad]
    for p, g in zip(params, grad, strict=True):
        p.grad = g.clone()
    torch.nn.utils.clip_grad_norm_(params, grad_clip)
    torch.optim.AdamW(params, lr=lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=weight_decay).step()
    new.zero_grad(set_to_none=True)
    return new.eval()


def policy_gradient(model: Any, episodes: list[dict]) -> list[torch.Tensor]:
    """∇ of the token-mean policy-gradient loss with advantage +1 (PPO's ratio is 1 at the first mini-batch, so
    this is verl's first gradient for a group whose episodes all scored above the mean)."""
    model.train()
    model.gradient_checkpointing_enable()
    model.zero_grad(set_to_none=True)
    total = sum(int(e["sampled_mask"].sum()) for e in episodes)
    for e in episodes:
        positions = e["all_positions"][e["sampled_mask"]]
        hidden = model.model(input_ids=e["ids"][None]).last_hidden_state[0]
        logp = torch.log_softmax(model.lm_head(hidden[positions - 1]).float(), -1)
        loss = -logp.gather(-1, e["ids"][positions][:, None]).sum() / total
        loss.backward()
    grad = [p.grad.detach().clone() for p in model.parameters() if p.requires_grad]
    model.zero_grad(set_to_none=True)
    model.gradient_checkpointing_disable()
    model.eval()
    return grad


def verl_metrics(rollout: list[torch.Tensor], actor: list[torch.Tensor]) -> dict[str, float]:
    """verl's own step metrics for a batch whose rows are the episodes: rollout vs actor log-probs."""
    from verl import DataProto
    from verl.trainer.ppo.rollout_corr_helper import compute_offpolicy_metrics
    from verl.utils.debug.metrics import calculate_debug_metrics

    width = max(len(r) for r in rollout)

    def pad(rows: list[torch.Tensor]) -> torch.Tensor:
        return torch.stack([torch.nn.functional.pad(r, (0, width - len(r))) for r in rows])

    mask = pad([torch.ones(len(r)) for r in rollout]).long()
    rl, al = pad(rollout), pad(actor)
    out = calculate_debug_metrics(DataProto.from_dict({"rollout_log_probs": rl, "old_log_probs": al,
                                                       "response_mask": mask, "responses": mask}))
    out.update({f"rollout_corr/{k}": float(v) for k, v in
                compute_offpolicy_metrics(al, rl, mask.bool()).items()})
    diff = (torch.cat(actor).exp() - torch.cat(rollout).exp()).abs().double()
    out.update({f"probs_diff_p{q:g}": float(torch.quantile(diff, q / 100)) for q in PERCENTILES})
    out["tokens"] = int(diff.numel())
    return {k: float(v) for k, v in out.items()}


def bf16_changed_share(before: Any, after: Any) -> float:
    """Share of the weights whose bfloat16 value differs between two float32 models."""
    changed = total = 0
    for a, b in zip(before.parameters(), after.parameters(), strict=True):
        changed += int((a.detach().bfloat16() != b.detach().bfloat16()).sum())
        total += a.numel()
    return changed / total


def measure(model_dir: Path, task_ids: list[str], lrs: list[float], seed: int) -> dict[str, Any]:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from seal.recipe import load_config

    recipe = load_config("exp/SEAL.yaml", [])
    tok = AutoTokenizer.from_pretrained(model_dir)
    t0 = time.time()
    rollouts = real_episodes(tok, task_ids)
    episodes = []
    for r in rollouts:
        n = len(r.prompt_ids)
        episodes.append({"task_id": r.task_id, "ids": torch.tensor(r.prompt_ids + r.response_ids),
                         "all_positions": torch.arange(n, n + len(r.response_ids)),
                         "sampled_mask": torch.tensor(r.response_mask, dtype=torch.bool)})
    shown = [(e["task_id"], len(e["ids"]), int(e["sampled_mask"].sum())) for e in episodes]
    print(f"episodes (task, tokens, sampled tokens): {shown} ({time.time() - t0:.0f} s)", flush=True)

    fp32 = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32, attn_implementation="sdpa").eval()
    base_fp32 = token_logprobs(fp32, episodes, draw_seed=seed)
    base_bf16 = token_logprobs(copy.deepcopy(fp32).to(torch.bfloat16), episodes)
    print(f"forwards of the base model done ({time.time() - t0:.0f} s)", flush=True)
    result: dict[str, Any] = {
        "model": str(model_dir), "tasks": task_ids, "seed": seed,
        "episodes": [{"task_id": e["task_id"], "tokens": len(e["ids"]), "response_tokens": len(e["all_positions"]),
                      "sampled_tokens": int(e["sampled_mask"].sum())} for e in episodes],
        "healthy_bf16_vs_fp32": {s: verl_metrics(base_bf16[s], base_fp32[s]) for s in TOKEN_SETS},
        "stale": {},
    }
    grad = policy_gradient(fp32, episodes)
    print(f"gradient done ({time.time() - t0:.0f} s)", flush=True)
    for lr in lrs:
        updated = one_update(fp32, episodes, lr, recipe.actor.weight_decay, grad, recipe.actor.grad_clip)
        after = token_logprobs(updated, episodes)
        result["stale"][f"{lr:g}"] = {
            "bf16_weights_changed_share": bf16_changed_share(fp32, updated),
            # what a GPU run with a stale sync reads: vLLM (bf16) one update behind the fp32 actor
            "bf16_before_vs_fp32_after": {s: verl_metrics(base_bf16[s], after[s]) for s in TOKEN_SETS},
            # the update alone, no precision difference
            "fp32_before_vs_fp32_after": {s: verl_metrics(base_fp32[s], after[s]) for s in TOKEN_SETS},
        }
        print(f"lr {lr:g} done ({time.time() - t0:.0f} s)", flush=True)
        del updated
    result["wall_s"] = round(time.time() - t0, 1)
    return result


def print_table(result: dict[str, Any]) -> None:
    keys = ("training/rollout_probs_diff_max", "training/rollout_probs_diff_mean", "probs_diff_p50",
            "probs_diff_p99", "rollout_corr/k3_kl", "rollout_corr/log_ppl_abs_diff")
    short = [k.split("/")[-1] for k in keys]
    print("pattern | tokens | " + " | ".join(short))
    rows = [("healthy bf16 vs fp32", result["healthy_bf16_vs_fp32"])]
    for lr, v in result["stale"].items():
        rows.append((f"stale lr {lr} (bf16 weights changed {v['bf16_weights_changed_share']:.2%})",
                     v["bf16_before_vs_fp32_after"]))
        rows.append((f"update alone lr {lr} (fp32 both)", v["fp32_before_vs_fp32_after"]))
    for name, by_set in rows:
        for s, m in by_set.items():
            print(f"{name} | {s} | " + " | ".join(f"{m[k]:.3g}" for k in keys))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="builtin:smollm2", help="a model directory or builtin:<name>")
    parser.add_argument("--tasks", nargs="+", default=list(DEFAULT_TASKS))
    parser.add_argument("--lrs", nargs="+", type=float, default=list(DEFAULT_LRS))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    parser.add_argument("--out", type=Path, help="write the JSON here")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    from seal.models import builtin_model, is_builtin

    model_dir = builtin_model(args.model) if is_builtin(args.model) else Path(args.model)
    result = measure(model_dir, args.tasks, args.lrs, args.seed)
    print_table(result)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

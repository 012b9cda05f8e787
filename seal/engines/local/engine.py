"""The embedded `local` engine: SEAL's GRPO training loop in one process (CPU, or one GPU).

Same agent loop, env service, SEAL controller and batching as the verl engine; generation is Hugging
Face `generate` and the policy update uses verl's own loss functions (`verl.trainer.ppo.core_algos`:
`compute_grpo_outcome_advantage`, `compute_policy_loss_vanilla` (dual-clip), `kl_penalty`,
`agg_loss`). One step (docs/engines.md)::

    Ω_t = controller.interface("train")
    rollouts = run_batch(train_batch_size tasks × n, Ω_t, sampling at temperature)   # env service
    controller.observe(rollouts)                       # C_t
    data = rollouts_to_dataproto(kept); GRPO advantages; controller.reweight(data)    # A-Patch
    old/ref log-probs; PPO mini-batches (dual-clip + low_var_kl + token-mean); AdamW; grad clip
    controller.evolve(step)                             # Ω_{t+1}
    epoch end: controller.end_epoch(); validation (greedy, raw interface); checkpoint

Determinism: every model call is seeded from (seed, step, request index, prompt length), so a run
resumed from a checkpoint continues exactly as the uninterrupted run (on the same device and
thread count).
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import os
import random
import shutil
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from env_service.vocab import CATEGORIES, category_of
from seal import recipe as C
from seal.core.controller import SealController
from seal.engines.batching import compute_grpo_advantages, group_uids, rollouts_to_dataproto
from seal.io_utils import write_json_atomic
from seal.logging_utils import MetricsLogger, progress
from seal.rollout.client import EnvClient
from seal.rollout.episode import EpisodeRequest, run_batch
from seal.rollout.hf_generation import HFGenerator
from seal.rollout.hf_generation import autocast_context as _autocast
from seal.rollout.types import GenerateFn, Rollout, SamplingParams

log = logging.getLogger("seal.engines.local.engine")

TRAINER_STATE = "trainer_state.pt"
CHECKPOINTS = "checkpoints"


# --------------------------------------------------------------------------- data
@dataclass(frozen=True)
class Task:
    task_id: str
    category: str


def load_tasks(path: str | os.PathLike[str], limit: int | None = None) -> list[Task]:
    """Task ids (and categories) of a parquet split (`data/bfcl_*.parquet`).

    `limit` keeps a subset taken round-robin over the categories in file order, so a handful of
    tasks still covers every category (first task of each category, then the second, ...).
    """
    import pandas as pd

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"data file not found: {path}")
    frame = pd.read_parquet(path)
    tasks = []
    for _, row in frame.iterrows():
        extra = row.get("extra_info")
        extra = extra if isinstance(extra, dict) else {}
        task_id = extra.get("task_id") or extra.get("index") or extra.get("original_id")
        if not task_id:
            raise ValueError(f"{path}: a row has no extra_info.task_id / index")
        category = extra.get("category") or row.get("data_source") or category_of(task_id)
        tasks.append(Task(str(task_id), str(category)))
    if limit is None or limit >= len(tasks):
        return tasks
    by_cat: dict[str, list[Task]] = {}
    for t in tasks:
        by_cat.setdefault(t.category, []).append(t)
    order = [c for c in CATEGORIES if c in by_cat] + sorted(c for c in by_cat if c not in CATEGORIES)
    out: list[Task] = []
    i = 0
    while len(out) < limit:
        for c in order:
            if i < len(by_cat[c]) and len(out) < limit:
                out.append(by_cat[c][i])
        i += 1
    return out


def epoch_order(num_tasks: int, epoch: int, seed: int, shuffle: bool) -> list[int]:
    """Task indices of one epoch: a permutation seeded by (seed, epoch), or file order."""
    if not shuffle:
        return list(range(num_tasks))
    gen = torch.Generator().manual_seed(int(seed) * 1_000_003 + int(epoch))
    return torch.randperm(num_tasks, generator=gen).tolist()


def step_tasks(tasks: Sequence[Task], step: int, cfg: C.Recipe) -> tuple[int, int, list[Task]]:
    """(epoch, batch index, tasks) of global step `step` (1-based); full batches only (drop_last)."""
    spe = C.steps_per_epoch(cfg, len(tasks))
    epoch, index = divmod(step - 1, spe)
    order = epoch_order(len(tasks), epoch, int(cfg.seed), bool(cfg.data.shuffle))
    size = int(cfg.data.train_batch_size)
    return epoch, index, [tasks[i] for i in order[index * size:(index + 1) * size]]


# --------------------------------------------------------------------------- generation
def episode_seed(base: int, step: int, index: int) -> int:
    return ((int(base) * 1_000_003 + int(step)) * 100_003 + int(index)) % (2**62)


GenerateFactory = Callable[[Any, Any, torch.device], GenerateFn]


# --------------------------------------------------------------------------- log-probs and the update
class _LossConfig:
    """The attributes verl's `compute_policy_loss_vanilla` reads from an `ActorConfig`."""

    def __init__(self, clip_low: float, clip_high: float, clip_c: float, global_batch_info: dict[str, Any]):
        self.clip_ratio = clip_low
        self.clip_ratio_low = clip_low
        self.clip_ratio_high = clip_high
        self.clip_ratio_c = clip_c
        self.global_batch_info = global_batch_info

    def get(self, key: str, default: Any = None) -> Any:
        return getattr(self, key, default)


def response_logprobs(model: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor, position_ids: torch.Tensor,
                      response_len: int, temperature: float = 1.0, with_entropy: bool = False
                      ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-probabilities of the last `response_len` tokens of each row under `model`.

    Args: input_ids / attention_mask / position_ids `[b, P + R]` (R = response_len).
    Returns `[b, R]` log-probs (and `[b, R]` entropies when asked). Logits are divided by the
    sampling temperature first, as verl does. Only the R+1 last positions go through the LM head
    (BFCL prompts are ~6k tokens; a full-vocabulary head over them would dominate memory).
    """
    out = model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                logits_to_keep=response_len + 1, use_cache=False)
    logits = out.logits[:, :-1, :].float()
    if temperature > 0 and temperature != 1.0:
        logits = logits / temperature
    targets = input_ids[:, -response_len:]
    lse = torch.logsumexp(logits, dim=-1)
    logp = logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1) - lse
    entropy = None
    if with_entropy:
        probs = torch.softmax(logits, dim=-1)
        entropy = lse - (probs * logits).sum(-1)
    return logp, entropy


def _trimmed(data: Any, rows: Sequence[int]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, int, int]:
    """Micro-batch tensors without the columns that are padding for every row of `rows`."""
    idx = torch.as_tensor(list(rows), dtype=torch.long)
    prompts_len = data.batch["prompts"].shape[1]
    attn = data.batch["attention_mask"][idx]
    prompt_attn, resp_attn = attn[:, :prompts_len], attn[:, prompts_len:]
    lp = int(prompt_attn.sum(1).max().item())
    lr = max(1, int(resp_attn.sum(1).max().item()))
    lo, hi = prompts_len - lp, prompts_len + lr
    return (data.batch["input_ids"][idx][:, lo:hi], attn[:, lo:hi], data.batch["position_ids"][idx][:, lo:hi], lr,
            lo)


def batch_logprobs(model: Any, data: Any, micro: int, device: torch.device, temperature: float,
                   autocast_dtype: torch.dtype | None) -> torch.Tensor:
    """`[B, R]` log-probs of every response token (no grad; zero on padding)."""
    bsz, resp_len = data.batch["responses"].shape
    out = torch.zeros((bsz, resp_len), dtype=torch.float32)
    with torch.no_grad(), _autocast(device, autocast_dtype):
        for start in range(0, bsz, micro):
            rows = list(range(start, min(start + micro, bsz)))
            ids, attn, pos, lr, _ = _trimmed(data, rows)
            logp, _ = response_logprobs(model, ids.to(device), attn.to(device), pos.to(device), lr, temperature)
            out[rows[0]:rows[-1] + 1, :lr] = logp.cpu()
    return out * data.batch["response_mask"]


def ppo_update(model: Any, ref_model: Any | None, optimizer: torch.optim.Optimizer, data: Any, cfg: C.Recipe,
               device: torch.device, autocast_dtype: torch.dtype | None = None) -> dict[str, float]:
    """PPO/GRPO actor update on `data` (advantages already computed and A-Patched).

    Mini-batches: the batch is split into train_batch_size / ppo_mini_batch_size parts (verl: one
    optimizer step per mini-batch of ppo_mini_batch_size tasks × n samples); each is processed in
    micro-batches of `ppo_micro_batch_size_per_gpu` rows with gradient accumulation, the loss
    aggregated over the whole mini-batch (`agg_loss` with the mini-batch's token / sequence count).
    """
    from verl.trainer.ppo.core_algos import agg_loss, compute_policy_loss_vanilla, kl_penalty

    actor = cfg.actor
    temperature = float(cfg.rollout.temperature) or 1.0
    micro = int(actor.ppo_micro_batch_size_per_gpu)
    model.eval()
    old_logp = batch_logprobs(model, data, micro, device, temperature, autocast_dtype)
    ref_logp = None
    if actor.use_kl_loss and ref_model is not None:
        ref_logp = batch_logprobs(ref_model, data, micro, device, temperature, autocast_dtype)
    model.train()
    advantages = data.batch["advantages"]
    mask = data.batch["response_mask"].float()
    bsz = advantages.shape[0]
    num_mini = max(1, min(bsz, int(cfg.data.train_batch_size) // int(actor.ppo_mini_batch_size)))
    minis = [m.tolist() for m in np.array_split(np.arange(bsz), num_mini)]
    params = [p for p in model.parameters() if p.requires_grad]
    acc: dict[str, list[float]] = {}

    def add(key: str, value: float) -> None:
        acc.setdefault(key, []).append(float(value))

    mode = str(actor.loss_agg_mode)
    for _ in range(int(actor.ppo_epochs)):
        for mini in minis:
            optimizer.zero_grad(set_to_none=True)
            info = {"dp_size": 1, "batch_num_tokens": mask[mini].sum().clamp(min=1.0),
                    "global_batch_size": max(1, int((mask[mini].sum(-1) > 0).sum()))}
            loss_cfg = _LossConfig(float(actor.clip_ratio_low), float(actor.clip_ratio_high),
                                   float(actor.clip_ratio_c), info)
            totals = Counter()
            for start in range(0, len(mini), micro):
                rows = mini[start:start + micro]
                ids, attn, pos, lr, _ = _trimmed(data, rows)
                with _autocast(device, autocast_dtype):
                    logp, entropy = response_logprobs(model, ids.to(device), attn.to(device), pos.to(device), lr,
                                                      temperature, with_entropy=float(actor.entropy_coeff) != 0.0)
                m = mask[rows, :lr].to(device)
                pg_loss, pg_metrics = compute_policy_loss_vanilla(
                    old_log_prob=old_logp[rows, :lr].to(device), log_prob=logp,
                    advantages=advantages[rows, :lr].to(device), response_mask=m, loss_agg_mode=mode,
                    config=loss_cfg)
                loss = pg_loss
                totals["pg_loss"] += float(pg_loss.detach())
                for k, v in pg_metrics.items():
                    totals[k] += float(v) * len(rows) / len(mini)
                if entropy is not None:
                    ent = agg_loss(loss_mat=entropy, loss_mask=m, loss_agg_mode=mode, **info)
                    loss = loss - float(actor.entropy_coeff) * ent
                    totals["entropy"] += float(ent.detach())
                if ref_logp is not None:
                    kld = kl_penalty(logp, ref_logp[rows, :lr].to(device), str(actor.kl_loss_type))
                    kl_loss = agg_loss(loss_mat=kld, loss_mask=m, loss_agg_mode=mode, **info)
                    loss = loss + float(actor.kl_loss_coef) * kl_loss
                    totals["kl_loss"] += float(kl_loss.detach())
                loss.backward()
            grad_norm = torch.nn.utils.clip_grad_norm_(params, float(actor.grad_clip) if actor.grad_clip else math.inf)
            if torch.isfinite(grad_norm):
                optimizer.step()
            else:  # verl skips the step on a non-finite gradient norm
                log.warning("non-finite grad norm %s: optimizer step skipped", grad_norm)
                optimizer.zero_grad(set_to_none=True)
            add("actor/grad_norm", float(grad_norm))
            for k, v in totals.items():
                add(k if k.startswith("actor/") else f"actor/{k}", v)
    model.eval()
    metrics = {k: sum(v) / len(v) for k, v in acc.items()}
    metrics["actor/lr"] = float(optimizer.param_groups[0]["lr"])
    if ref_logp is not None:
        metrics["actor/kl_coef"] = float(actor.kl_loss_coef)
    metrics["actor/num_mini_batches"] = float(len(minis) * int(actor.ppo_epochs))
    return metrics


# --------------------------------------------------------------------------- checkpoints


def latest_checkpoint(run_dir: Path) -> Path | None:
    """The checkpoint named by `checkpoints/latest.json`, if any."""
    pointer = run_dir / CHECKPOINTS / "latest.json"
    if not pointer.is_file():
        return None
    entry = json.loads(pointer.read_text(encoding="utf-8"))
    path = run_dir / entry["path"]
    return path if path.is_dir() else None


def save_checkpoint(run_dir: Path, step: int, model: Any, tokenizer: Any, optimizer: torch.optim.Optimizer,
                    controller: SealController, trainer_state: dict[str, Any]) -> Path:
    """`checkpoints/step_<N>/`: HF model + tokenizer, `seal_state.json`, optimizer + trainer state."""
    root = run_dir / CHECKPOINTS
    final = root / f"step_{step}"
    tmp = root / f".step_{step}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    model.save_pretrained(str(tmp))
    tokenizer.save_pretrained(str(tmp))
    controller.save(tmp)
    torch.save({"optimizer": optimizer.state_dict(), **trainer_state,
                "rng": {"torch": torch.get_rng_state(), "numpy": np.random.get_state(), "python": random.getstate()}},
               tmp / TRAINER_STATE)
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)
    write_json_atomic(root / "latest.json", {"step": step, "path": f"{CHECKPOINTS}/step_{step}"})
    return final


# --------------------------------------------------------------------------- the run
def _device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def _dtypes(cfg: C.Recipe, device: torch.device) -> torch.dtype | None:
    """Autocast dtype: weights and optimizer stay float32 (lr 1e-6 updates vanish in bf16 weights);
    on a GPU the forward passes run in `model.dtype`. On CPU everything is float32."""
    if device.type != "cuda" or cfg.model.dtype == "float32":
        return None
    return torch.bfloat16 if cfg.model.dtype == "bfloat16" else torch.float16


def prepare_model_path(cfg: C.Recipe) -> Path:
    """The model directory; builds the tiny random Qwen2 there first when `model.build_tiny` is on."""
    path = Path(str(cfg.model.path))
    if cfg.model.build_tiny:
        if not (path / "config.json").is_file():
            from seal.tiny_model import build_tiny_qwen2

            log.info("building a tiny random Qwen2 at %s", path)
            build_tiny_qwen2(path, hidden=int(cfg.model.tiny.hidden), layers=int(cfg.model.tiny.layers),
                             seed=int(cfg.model.tiny.seed))
        return path
    return path if path.exists() else Path(str(cfg.model.path))  # a hub id: transformers resolves it


def _rollout_metrics(rollouts: Sequence[Rollout], prefix: str = "rollout/") -> dict[str, float]:
    n = len(rollouts)
    if not n:
        return {}
    out = {
        f"{prefix}response_length_mean": sum(len(r.response_ids) for r in rollouts) / n,
        f"{prefix}prompt_length_mean": sum(len(r.prompt_ids) for r in rollouts) / n,
        f"{prefix}model_calls_mean": sum(r.num_model_calls for r in rollouts) / n,
        f"{prefix}truncated_frac": sum(1.0 for r in rollouts if r.truncated) / n,
    }
    for reason, count in Counter(r.stop_reason for r in rollouts).items():
        out[f"{prefix}stop/{reason}"] = float(count)
    return out


async def _play(cfg: C.Recipe, generate: GenerateFn, tokenizer: Any, requests: list[EpisodeRequest],
                params: SamplingParams, reward_fn: Callable[[dict], float], desc: str) -> list[Rollout]:
    bar = progress(len(requests), desc)
    try:
        async with EnvClient(list(cfg.env.urls), timeout=float(cfg.env.timeout_s),
                             max_retries=int(cfg.env.max_retries)) as client:
            return await run_batch(client, generate, tokenizer, requests, params, C.rollout_limits(cfg),
                                   concurrency=int(cfg.rollout.concurrency), reward_fn=reward_fn,
                                   max_restarts=int(cfg.env.max_restarts), on_done=lambda i, r: bar.update(1))
    finally:
        bar.close()


def _accuracy_reward(result: dict) -> float:
    return float(result["accuracy"])


def validate(cfg: C.Recipe, generate: GenerateFn, tokenizer: Any, val_tasks: Sequence[Task], step: int,
             run_dir: Path) -> dict[str, float]:
    """Greedy validation on the raw interface (n = rollout.val_n); writes `validation/step_<N>.jsonl`."""
    params = C.sampling_params(cfg, "val")
    reqs = [EpisodeRequest(t.task_id, "eval", None, replace(params, seed=episode_seed(cfg.seed, -1 - step, i)))
            for i, t in enumerate(t for t in val_tasks for _ in range(int(cfg.rollout.val_n)))]
    t0 = time.perf_counter()
    rollouts = asyncio.run(_play(cfg, generate, tokenizer, reqs, params, _accuracy_reward, f"validation@{step}"))
    metrics = SealController.validation_metrics(rollouts)
    metrics |= _rollout_metrics(rollouts, "val_rollout/")
    metrics["timing/validation"] = time.perf_counter() - t0
    out = run_dir / "validation"
    out.mkdir(parents=True, exist_ok=True)
    with open(out / f"step_{step}.jsonl", "w", encoding="utf-8") as fh:
        for r in rollouts:
            fh.write(json.dumps({"task_id": r.task_id, "category": r.category, "accuracy": r.accuracy,
                                 "failure_tags": r.failure_tags, "paper_labels": r.paper_labels,
                                 "num_model_calls": r.num_model_calls, "excluded": r.excluded,
                                 "exclude_reason": r.exclude_reason}) + "\n")
    return metrics


def _resume_point(cfg: C.Recipe, run_dir: Path) -> Path | None:
    mode = str(cfg.trainer.resume)
    if mode == "disable":
        return None
    if mode == "auto":
        return latest_checkpoint(run_dir)
    path = Path(mode)
    if not path.is_dir():
        raise FileNotFoundError(f"trainer.resume: checkpoint directory {path} does not exist")
    return path


def train(cfg: C.Recipe, run_dir: str | os.PathLike[str], generate_factory: GenerateFactory | None = None
          ) -> dict[str, Any]:
    """Train with the local engine; returns `{"last_step", "best", "run_dir"}`.

    `generate_factory(model, tokenizer, device) -> GenerateFn` replaces HF generation (tests use a
    scripted backend); the update always uses the model.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # per-save/load shard bars would drown the step bars
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    seed = int(cfg.seed)
    random.seed(seed)
    np.random.seed(seed % (2**32))
    torch.manual_seed(seed)
    device = _device()
    autocast_dtype = _dtypes(cfg, device)

    train_tasks = load_tasks(cfg.data.train_files, cfg.data.max_train_tasks)
    val_tasks = load_tasks(cfg.data.val_files, cfg.data.max_val_tasks)
    total_steps = C.total_training_steps(cfg, len(train_tasks))
    spe = C.steps_per_epoch(cfg, len(train_tasks))

    base_path = prepare_model_path(cfg)
    resume_from = _resume_point(cfg, run_dir)
    load_path = resume_from if resume_from is not None else base_path
    tokenizer = AutoTokenizer.from_pretrained(str(load_path))
    model = AutoModelForCausalLM.from_pretrained(str(load_path), dtype=torch.float32).to(device)
    model.eval()
    ref_model = None
    if cfg.actor.use_kl_loss:
        ref_model = AutoModelForCausalLM.from_pretrained(str(base_path), dtype=torch.float32).to(device)
        ref_model.eval().requires_grad_(False)
    optimizer = torch.optim.AdamW(model.parameters(), lr=float(cfg.actor.lr),
                                  weight_decay=float(cfg.actor.weight_decay))
    controller = SealController(cfg.seal)
    start_step = 0
    best: dict[str, Any] | None = None
    if resume_from is not None:
        state = torch.load(resume_from / TRAINER_STATE, map_location="cpu", weights_only=False)
        optimizer.load_state_dict(state["optimizer"])
        controller.load(resume_from, force=str(cfg.trainer.resume) not in ("auto", "disable"))
        start_step = int(state["step"])
        best = state.get("best")
        torch.set_rng_state(state["rng"]["torch"])
        np.random.set_state(state["rng"]["numpy"])
        random.setstate(state["rng"]["python"])
        log.info("resumed from %s (step %d, run %s)", resume_from, start_step, controller.run_id)

    logger = MetricsLogger(run_dir, list(cfg.trainer.logger), resume_step=start_step if resume_from else None,
                           wandb_project=str(cfg.trainer.wandb_project), experiment_name=str(cfg.experiment_name),
                           config=C.to_container(cfg))
    generate = (generate_factory or (lambda m, t, d: HFGenerator(m, t, d, autocast_dtype)))(model, tokenizer, device)
    pad_id = int(tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id)
    best_key = str(cfg.trainer.best_metric)
    log.info("local engine: %d train tasks, %d val tasks, %d steps (%d per epoch), device %s, run %s",
             len(train_tasks), len(val_tasks), total_steps, spe, device, controller.run_id)

    def trainer_state(step: int) -> dict[str, Any]:
        epoch, index = divmod(step, spe)
        return {"step": step, "epoch": epoch, "batch_in_epoch": index, "best": best, "run_id": controller.run_id,
                "total_steps": total_steps}

    def after_validation(step: int, metrics: dict[str, float]) -> bool:
        nonlocal best
        value = metrics.get(best_key)
        if value is None or (best is not None and not value > best["value"]):  # release: strict improvement
            return False
        best = {"step": step, "path": f"{CHECKPOINTS}/step_{step}", "metric": best_key, "value": float(value)}
        return True

    def checkpoint(step: int, improved: bool) -> dict[str, float]:
        t0 = time.perf_counter()
        save_checkpoint(run_dir, step, model, tokenizer, optimizer, controller, trainer_state(step))
        if improved:
            write_json_atomic(run_dir / CHECKPOINTS / "best.json", best)
        return {"timing/checkpoint": time.perf_counter() - t0}

    if start_step >= total_steps:
        log.info("the run in %s is already complete (step %d of %d); trainer.resume=disable starts it over",
                 run_dir, start_step, total_steps)
    try:
        if resume_from is None and cfg.trainer.val_before_train:
            metrics = validate(cfg, generate, tokenizer, val_tasks, 0, run_dir)
            improved = after_validation(0, metrics)
            if improved:
                metrics |= checkpoint(0, True)
            logger.log(metrics, 0)
        steps_bar = progress(total_steps, "training steps", leave=True)
        steps_bar.update(start_step)
        for step in range(start_step + 1, total_steps + 1):
            t_step = time.perf_counter()
            epoch, index, tasks = step_tasks(train_tasks, step, cfg)
            controller.set_training_progress(step - 1, total_steps)
            omega = controller.interface("train")
            params = C.sampling_params(cfg, "train")
            reqs = []
            for t in tasks:
                for _ in range(int(cfg.rollout.n)):
                    reqs.append(EpisodeRequest(t.task_id, "train", omega,
                                               replace(params, seed=episode_seed(seed, step, len(reqs)))))
            t0 = time.perf_counter()
            rollouts = asyncio.run(_play(cfg, generate, tokenizer, reqs, params, controller.reward_fn,
                                         f"rollouts@{step}"))
            metrics: dict[str, float] = {"timing/rollout": time.perf_counter() - t0,
                                         "train/epoch": float(epoch), "train/step_in_epoch": float(index)}
            metrics |= controller.observe(rollouts, step)
            metrics |= _rollout_metrics(rollouts)
            kept = [r for r in rollouts if not r.excluded]
            if kept:
                t0 = time.perf_counter()
                data = rollouts_to_dataproto(kept, pad_id, uids=group_uids(kept, step))
                compute_grpo_advantages(data, bool(cfg.algorithm.norm_adv_by_std_in_grpo))
                metrics |= controller.reweight(data, step)
                metrics["train/advantage_abs_mean"] = float(
                    (data.batch["advantages"].abs() * data.batch["response_mask"]).sum()
                    / data.batch["response_mask"].sum().clamp(min=1))
                metrics |= ppo_update(model, ref_model, optimizer, data, cfg, device, autocast_dtype)
                metrics["timing/update"] = time.perf_counter() - t0
            else:
                log.warning("step %d: every rollout was excluded; no update", step)
            metrics |= controller.evolve(step)
            if index == spe - 1:
                controller.end_epoch()
            last = step == total_steps
            test_freq = int(cfg.trainer.test_freq)
            improved = False
            if test_freq > 0 and (step % test_freq == 0 or last):
                val = validate(cfg, generate, tokenizer, val_tasks, step, run_dir)
                improved = after_validation(step, val)
                metrics |= val
            save_freq = int(cfg.trainer.save_freq)
            if last or improved or (save_freq > 0 and step % save_freq == 0):
                metrics |= checkpoint(step, improved)
            metrics["timing/step"] = time.perf_counter() - t_step
            logger.log(metrics, step)
            steps_bar.update(1)
        steps_bar.close()
    finally:
        logger.close()
    return {"last_step": total_steps, "best": best, "run_dir": str(run_dir), "run_id": controller.run_id}

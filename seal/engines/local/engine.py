"""The embedded `local` engine: SEAL's GRPO training loop in one process (CPU, or one GPU).

Same agent loop, env service, SEAL controller and batching as the verl engine; generation is batched
Hugging Face decoding (`seal/rollout/hf_generation.py`) or a vLLM engine in this process whose weights are
synced after every update (`seal/rollout/vllm_generation.py`; `rollout.backend`, `choose_backend`), and the
policy update uses verl's own loss functions (`verl.trainer.ppo.core_algos`: `compute_grpo_outcome_advantage`,
`compute_policy_loss_vanilla` (dual-clip), `kl_penalty`, `agg_loss`).

Read it top to bottom: `train` (the entry) and `setup` build a `LocalRun`; `training_step` is one SEAL
step, every controller call in order (docs/engines.md, "One training step"); below it the plumbing
(data order, validation, checkpoint I/O, log-probs and the PPO update, small helpers).

Determinism: every model call is seeded from (seed, step, request index, prompt length), so a run
resumed from a checkpoint continues as the uninterrupted run. Exactly (bit for bit, on the same device
and thread count) with `rollout.deterministic_generation`, where every call is computed alone; in the
default batched generation a call's logits can differ in the last bits with the batch it shared
(`seal/rollout/hf_generation.py`); vLLM's likewise.
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

from seal import recipe as C
from seal.core.adaptive import RepairStats
from seal.core.controller import SealController
from seal.core.curriculum import draw_batch
from seal.engines.batching import compute_grpo_advantages, group_uids, no_learning_signal, rollouts_to_dataproto
from seal.engines.data import Task, load_tasks
from seal.logging_utils import MetricsLogger, progress
from seal.rollout.client import EnvClient
from seal.rollout.episode import EpisodeRequest, check_infra_loss, run_batch
from seal.rollout.hf_generation import HFGenerator
from seal.rollout.hf_generation import autocast_context as _autocast
from seal.rollout.types import GenerateFn, Rollout, SamplingParams
from seal.rollout.vllm_generation import ColocatedVLLM, colocated_vllm, vllm_cannot_run
from seal.run_dir import (
    TRAINER_STATE_FILE,
    Checkpoints,
    RunDir,
    best_record,
    cut_text,
    improves,
    transcript_sample,
    write_transcripts,
)

log = logging.getLogger("seal.engines.local.engine")

GenerateFactory = Callable[[Any, Any, torch.device], GenerateFn]


# =========================================================================== setup
@dataclass
class LocalRun:
    """Everything one local training run holds between steps."""

    cfg: C.Recipe
    run: RunDir
    device: torch.device
    autocast_dtype: torch.dtype | None
    tokenizer: Any
    model: Any
    ref_model: Any | None  # the frozen base model, for the KL loss
    optimizer: torch.optim.Optimizer
    controller: SealController
    generate: GenerateFn
    vllm: ColocatedVLLM | None  # the generation engine when it is vLLM: weights synced, log-probs checked
    logger: MetricsLogger
    train_tasks: list[Task]
    val_tasks: list[Task]
    total_steps: int
    steps_per_epoch: int
    pad_id: int
    start_step: int  # the last step already done (0 for a fresh run)
    resumed: bool
    best: dict[str, Any] | None  # the best.json record so far


def train(cfg: C.Recipe, run_dir: str | os.PathLike[str], generate_factory: GenerateFactory | None = None
          ) -> dict[str, Any]:
    """Train with the local engine; returns `{"last_step", "best", "run_dir", "run_id"}`.

    `generate_factory(model, tokenizer, device) -> GenerateFn` replaces HF generation (tests use a
    scripted backend); the update always uses the model.
    """
    run = setup(cfg, run_dir, generate_factory)
    try:
        if not run.resumed and cfg.trainer.val_before_train:
            metrics = validate(run, 0)
            if note_validation(run, 0, metrics):
                metrics |= checkpoint(run, 0, improved=True)
            run.logger.log(metrics, 0)
        steps_bar = progress(run.total_steps, "training steps", leave=True)
        steps_bar.update(run.start_step)
        for step in range(run.start_step + 1, run.total_steps + 1):
            run.logger.log(training_step(run, step), step)
            steps_bar.update(1)
        steps_bar.close()
    finally:
        close(run)
    return {"last_step": run.total_steps, "best": run.best, "run_dir": str(run.run.root),
            "run_id": run.controller.run_id}


def setup(cfg: C.Recipe, run_dir: str | os.PathLike[str], generate_factory: GenerateFactory | None = None) -> LocalRun:
    """Seeds, tasks, models, optimizer, controller and logger; restores a checkpoint when resuming.

    The order is part of exact resume: the RNG states saved with a checkpoint are restored after the
    models are loaded, as when the checkpoint's run started.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # per-save/load shard bars would drown the step bars
    run = RunDir(run_dir)
    run.root.mkdir(parents=True, exist_ok=True)
    seed = cfg.seed
    random.seed(seed)
    np.random.seed(seed % (2**32))
    torch.manual_seed(seed)
    device = _device()
    autocast_dtype = _dtypes(cfg, device)

    train_tasks = load_tasks(cfg.data.train_files, cfg.data.max_train_tasks, cfg.data.train_task_ids)
    val_tasks = load_tasks(cfg.data.val_files, cfg.data.max_val_tasks, cfg.data.val_task_ids)
    total_steps = C.total_training_steps(cfg, len(train_tasks))
    spe = C.steps_per_epoch(cfg, len(train_tasks))

    base_path = prepare_model_path(cfg)
    if cfg.model.warm_start.enable:  # the starting policy (and the KL reference) is the warm-started model
        from seal.engines.local.warm_start import build_warm_start

        base_path = build_warm_start(cfg, base_path, train_tasks)
    resume_from = resume_point(cfg, run)
    load_path = resume_from if resume_from is not None else base_path
    tokenizer = AutoTokenizer.from_pretrained(str(load_path))
    model = AutoModelForCausalLM.from_pretrained(str(load_path), dtype=torch.float32).to(device)
    if cfg.actor.gradient_checkpointing:
        enable_gradient_checkpointing(model)
    model.eval()
    ref_model = None
    if cfg.actor.use_kl_loss:
        ref_model = AutoModelForCausalLM.from_pretrained(str(base_path), dtype=torch.float32).to(device)
        ref_model.eval().requires_grad_(False)
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.actor.lr,
                                  weight_decay=cfg.actor.weight_decay)
    controller = SealController(cfg.seal)
    start_step, best = 0, None
    if resume_from is not None:
        start_step, best = restore_checkpoint(resume_from, optimizer, controller,
                                              force=cfg.trainer.resume not in ("auto", "disable"))

    logger = MetricsLogger(run.root, list(cfg.trainer.logger), resume_step=start_step if resume_from else None,
                           wandb_project=cfg.trainer.wandb_project, experiment_name=cfg.experiment_name,
                           config=C.to_container(cfg))
    vllm = None
    if generate_factory is not None:
        generate = generate_factory(model, tokenizer, device)
    else:
        backend, why = choose_backend(cfg, load_path, device)
        log.info("rollout backend: %s (%s)", backend, why)
        if backend == "vllm":
            generate = vllm = vllm_generator(cfg, model, tokenizer, load_path, device)
            log.info("rollout backend: %s", vllm.describe())
        else:
            generate = hf_generator(cfg, model, tokenizer, device, autocast_dtype)
    pad_id = int(tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id)
    log.info("local engine: %d train tasks, %d val tasks, %d steps (%d per epoch), device %s, run %s",
             len(train_tasks), len(val_tasks), total_steps, spe, device, controller.run_id)
    if start_step >= total_steps:
        log.info("the run in %s is already complete (step %d of %d); trainer.resume=disable starts it over",
                 run.root, start_step, total_steps)
    return LocalRun(cfg=cfg, run=run, device=device, autocast_dtype=autocast_dtype, tokenizer=tokenizer, model=model,
                    ref_model=ref_model, optimizer=optimizer, controller=controller, generate=generate, vllm=vllm,
                    logger=logger,
                    train_tasks=train_tasks, val_tasks=val_tasks, total_steps=total_steps, steps_per_epoch=spe,
                    pad_id=pad_id, start_step=start_step, resumed=resume_from is not None, best=best)


def close(run: LocalRun) -> None:
    """The end of a run: the metrics log is closed and a vLLM engine shut down."""
    try:
        run.logger.close()
    finally:
        if run.vllm is not None:
            run.vllm.close()


# =========================================================================== the training step
def training_step(run: LocalRun, step: int) -> dict[str, float]:
    """Global step `step` (1-based) of the run, top to bottom; returns the step's metrics."""
    cfg, controller = run.cfg, run.controller
    t_step = time.perf_counter()
    epoch, index, tasks = step_tasks(run.train_tasks, step, cfg, controller.repair)

    # 1. Episodes on Ω_t: each task rollout.n times, sampled; the controller turns each reply into a reward.
    controller.set_training_progress(step - 1, run.total_steps, run.steps_per_epoch)
    omega = controller.interface("train")
    params = C.sampling_params(cfg, "train")
    requests = training_requests(cfg, tasks, omega, params, step)
    t0 = time.perf_counter()
    rollouts = play(run, requests, params, controller.reward_fn, f"rollouts@{step}")
    metrics: dict[str, float] = {"timing/rollout": time.perf_counter() - t0,
                                 "train/epoch": float(epoch), "train/step_in_epoch": float(index)}

    write_transcripts(run.run.transcripts_file(step), transcript_entries(rollouts))

    # 2. C_t: the capability state observes the step's non-excluded rollouts.
    metrics |= controller.observe([r.record() for r in rollouts], step)
    metrics |= rollout_metrics(rollouts)

    # 3. GRPO advantages per task group, A-Patch reweighting, the PPO update (excluded rollouts train nothing).
    kept = [r for r in rollouts if not r.excluded]
    if kept:
        t0 = time.perf_counter()
        data = rollouts_to_dataproto(kept, run.pad_id, uids=group_uids(kept, step))
        compute_grpo_advantages(data, cfg.algorithm.norm_adv_by_std_in_grpo)
        metrics |= controller.reweight(data, step)
        metrics["train/advantage_abs_mean"] = advantage_abs_mean(data)
        metrics["train/mixed_group_frac"] = mixed_group_frac(kept)
        old_logp = None
        if run.vllm is not None:  # verl's check of the rollout engine against the actor, on every step
            old_logp = actor_logprobs(run.model, data, cfg, run.device, run.autocast_dtype)
            metrics |= rollout_logprob_check(data, old_logp)
        metrics |= ppo_update(run.model, run.ref_model, run.optimizer, data, cfg, run.device, run.autocast_dtype,
                              old_logp=old_logp)
        metrics["timing/update"] = time.perf_counter() - t0
        if run.vllm is not None and not metrics["actor/update_skipped"]:
            # Step t+1's episodes are sampled from the policy this update made.
            t0 = time.perf_counter()
            run.vllm.sync_weights(run.model)
            metrics["timing/weight_sync"] = time.perf_counter() - t0
    else:
        log.warning("step %d: every rollout was excluded; no update", step)

    # 4. Ω_{t+1} from C_t; the capability window restarts at an epoch end.
    metrics |= controller.evolve(step)
    if index == run.steps_per_epoch - 1:
        controller.end_epoch()

    # 5. Validation every test_freq steps and at the last one; a checkpoint every save_freq steps, at the
    #    last one and on a new best.
    last = step == run.total_steps
    test_freq, save_freq = cfg.trainer.test_freq, cfg.trainer.save_freq
    improved = False
    if test_freq > 0 and (step % test_freq == 0 or last):
        val = validate(run, step)
        improved = note_validation(run, step, val)
        metrics |= val
    if last or improved or (save_freq > 0 and step % save_freq == 0):
        metrics |= checkpoint(run, step, improved)
    metrics["timing/step"] = time.perf_counter() - t_step
    return metrics


# =========================================================================== plumbing
# --------------------------------------------------------------------------- data order and episodes
def epoch_order(num_tasks: int, epoch: int, seed: int, shuffle: bool) -> list[int]:
    """Task indices of one epoch: a permutation seeded by (seed, epoch), or file order."""
    if not shuffle:
        return list(range(num_tasks))
    gen = torch.Generator().manual_seed(int(seed) * 1_000_003 + int(epoch))
    return torch.randperm(num_tasks, generator=gen).tolist()


def step_tasks(tasks: Sequence[Task], step: int, cfg: C.Recipe,
               repair: RepairStats | None = None) -> tuple[int, int, list[Task]]:
    """(epoch, batch index, tasks) of global step `step` (1-based); full batches only (drop_last).
    `data.sampler: failure_profile` draws the batch from `repair` (seal.core.curriculum) instead."""
    spe = C.steps_per_epoch(cfg, len(tasks))
    epoch, index = divmod(step - 1, spe)
    size = cfg.data.train_batch_size
    if cfg.data.sampler == "failure_profile":
        if repair is None:
            raise ValueError("data.sampler: failure_profile needs the controller's repair statistics")
        rows = draw_batch([t.task_id for t in tasks], repair, cfg.data.sampler_floor, size, cfg.seed, step)
        return epoch, index, [tasks[i] for i in rows]
    order = epoch_order(len(tasks), epoch, cfg.seed, cfg.data.shuffle)
    return epoch, index, [tasks[i] for i in order[index * size:(index + 1) * size]]


def episode_seed(base: int, step: int, index: int) -> int:
    return ((int(base) * 1_000_003 + int(step)) * 100_003 + int(index)) % (2**62)


def training_requests(cfg: C.Recipe, tasks: Sequence[Task], omega: dict | None, params: SamplingParams,
                      step: int) -> list[EpisodeRequest]:
    """Each task `rollout.n` times (consecutive rows: one GRPO group), each episode seeded by its index."""
    reqs: list[EpisodeRequest] = []
    for t in tasks:
        for _ in range(cfg.rollout.n):
            reqs.append(EpisodeRequest(t.task_id, "train", omega,
                                       replace(params, seed=episode_seed(cfg.seed, step, len(reqs)))))
    return reqs


def play(run: LocalRun, requests: list[EpisodeRequest], params: SamplingParams,
         reward_fn: Callable[[dict], float], desc: str) -> list[Rollout]:
    """Run the episodes against the env service (one event loop per batch) with a progress bar."""
    return asyncio.run(_play(run.cfg, run.generate, run.tokenizer, requests, params, reward_fn, desc,
                             service_log=run.run.env_service_log))


async def _play(cfg: C.Recipe, generate: GenerateFn, tokenizer: Any, requests: list[EpisodeRequest],
                params: SamplingParams, reward_fn: Callable[[dict], float], desc: str,
                service_log: Path | None = None) -> list[Rollout]:
    bar = progress(len(requests), desc)
    try:
        async with EnvClient(list(cfg.env.urls), timeout=cfg.env.timeout_s,
                             max_retries=cfg.env.max_retries) as client:
            rollouts = await run_batch(client, generate, tokenizer, requests, params, C.rollout_limits(cfg),
                                       concurrency=cfg.rollout.concurrency, reward_fn=reward_fn,
                                       max_restarts=cfg.env.max_restarts, on_done=lambda i, r: bar.update(1))
        # Loud, never a silent run.
        check_infra_loss([r.record() for r in rollouts], cfg.env.max_infra_loss, ", ".join(cfg.env.urls),
                         service_log)
        return rollouts
    finally:
        bar.close()


def rollout_metrics(rollouts: Sequence[Rollout], prefix: str = "rollout/") -> dict[str, float]:
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


def mixed_group_frac(rollouts: Sequence[Rollout]) -> float:
    """Share of the GRPO groups (a task's rollouts) whose rewards differ: only they carry a learning signal."""
    groups: dict[str, set[float]] = {}
    for r in rollouts:
        groups.setdefault(r.task_id, set()).add(float(r.reward))
    return sum(len(v) > 1 for v in groups.values()) / len(groups) if groups else 0.0


def advantage_abs_mean(data: Any) -> float:
    """Mean |A| over the response tokens that train (after A-Patch)."""
    mask = data.batch["response_mask"]
    return float((data.batch["advantages"].abs() * mask).sum() / mask.sum().clamp(min=1))


# --------------------------------------------------------------------------- validation and the best checkpoint
def _accuracy_reward(result: dict) -> float:
    return float(result["accuracy"])


def transcript_entries(rollouts: Sequence[Rollout]) -> list[dict[str, Any]]:
    """The step's kept episodes (`seal.run_dir.transcript_sample`) with their messages, each cut."""
    return [{"task_id": r.task_id, "category": r.category, "reward": r.reward, "accuracy": r.accuracy,
             "failure_tags": r.failure_tags, "num_model_calls": r.num_model_calls, "stop_reason": r.stop_reason,
             "excluded": r.excluded,
             "messages": [{**m, "content": cut_text(str(m.get("content", "")))} for m in r.messages]}
            for r in (rollouts[i] for i in transcript_sample([r.task_id for r in rollouts]))]


def validate(run: LocalRun, step: int) -> dict[str, float]:
    """Greedy validation on the raw interface (n = rollout.val_n); writes `validation/step_<N>.jsonl`."""
    cfg = run.cfg
    params = C.sampling_params(cfg, "val")
    reqs = [EpisodeRequest(t.task_id, "eval", None, replace(params, seed=episode_seed(cfg.seed, -1 - step, i)))
            for i, t in enumerate(t for t in run.val_tasks for _ in range(cfg.rollout.val_n))]
    t0 = time.perf_counter()
    rollouts = play(run, reqs, params, _accuracy_reward, f"validation@{step}")
    metrics = SealController.validation_metrics([r.record() for r in rollouts])
    metrics |= rollout_metrics(rollouts, "val_rollout/")
    metrics["timing/validation"] = time.perf_counter() - t0
    out = run.run.validation_file(step)
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out, "w", encoding="utf-8") as fh:
        for r in rollouts:
            fh.write(json.dumps({"task_id": r.task_id, "category": r.category, "accuracy": r.accuracy,
                                 "failure_tags": r.failure_tags, "paper_labels": r.paper_labels,
                                 "num_model_calls": r.num_model_calls, "excluded": r.excluded,
                                 "exclude_reason": r.exclude_reason}) + "\n")
    return metrics


def note_validation(run: LocalRun, step: int, metrics: dict[str, float]) -> bool:
    """Record a new best (`seal.run_dir.improves` on `trainer.best_metric`); True when this step is it."""
    key = run.cfg.trainer.best_metric
    value = metrics.get(key)
    if not improves(value, None if run.best is None else run.best["value"]):
        return False
    run.best = best_record(step, Checkpoints.ref(step), key, float(value))
    return True


# --------------------------------------------------------------------------- checkpoint I/O
def checkpoint(run: LocalRun, step: int, improved: bool) -> dict[str, float]:
    """Save step `step` (and `best.json` when it is the new best); returns its timing."""
    t0 = time.perf_counter()
    save_checkpoint(run.run, step, run.model, run.tokenizer, run.optimizer, run.controller, trainer_state(run, step))
    if improved:
        run.run.checkpoints.write_best(run.best)
    return {"timing/checkpoint": time.perf_counter() - t0}


def trainer_state(run: LocalRun, step: int) -> dict[str, Any]:
    epoch, index = divmod(step, run.steps_per_epoch)
    return {"step": step, "epoch": epoch, "batch_in_epoch": index, "best": run.best,
            "run_id": run.controller.run_id, "total_steps": run.total_steps}


def save_checkpoint(run: RunDir, step: int, model: Any, tokenizer: Any, optimizer: torch.optim.Optimizer,
                    controller: SealController, state: dict[str, Any]) -> Path:
    """`checkpoints/step_<N>/`: HF model + tokenizer, `seal_state.json`, optimizer + trainer state.

    Assembled in a staging folder and renamed into place, then `latest.json` points at it: an
    interrupted save never leaves a half-written checkpoint that resume would pick.
    """
    ckpts = run.checkpoints
    final, tmp = ckpts.step_dir(step), ckpts.staging_dir(step)
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    model.save_pretrained(str(tmp))
    tokenizer.save_pretrained(str(tmp))
    controller.save(tmp)
    torch.save({"optimizer": optimizer.state_dict(), **state,
                "rng": {"torch": torch.get_rng_state(), "numpy": np.random.get_state(), "python": random.getstate()}},
               tmp / TRAINER_STATE_FILE)
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)
    ckpts.write_latest(step)
    return final


def resume_point(cfg: C.Recipe, run: RunDir) -> Path | None:
    """The checkpoint to resume from: `trainer.resume` auto (latest.json), disable, or a directory."""
    mode = cfg.trainer.resume
    if mode == "disable":
        return None
    if mode == "auto":
        return run.latest_checkpoint()
    path = Path(mode)
    if not path.is_dir():
        raise FileNotFoundError(f"trainer.resume: checkpoint directory {path} does not exist")
    return path


def restore_checkpoint(folder: Path, optimizer: torch.optim.Optimizer, controller: SealController,
                       force: bool) -> tuple[int, dict[str, Any] | None]:
    """Optimizer, controller and RNG states from a checkpoint; returns (step, best record)."""
    state = torch.load(folder / TRAINER_STATE_FILE, map_location="cpu", weights_only=False)
    optimizer.load_state_dict(state["optimizer"])
    controller.load(folder, force=force)
    torch.set_rng_state(state["rng"]["torch"])
    np.random.set_state(state["rng"]["numpy"])
    random.setstate(state["rng"]["python"])
    log.info("resumed from %s (step %d, run %s)", folder, int(state["step"]), controller.run_id)
    return int(state["step"]), state.get("best")


# --------------------------------------------------------------------------- device and model
def _device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def _dtypes(cfg: C.Recipe, device: torch.device) -> torch.dtype | None:
    """Autocast dtype: weights and optimizer stay float32 (lr 1e-6 updates vanish in bf16 weights);
    on a GPU the forward passes run in `model.dtype`. On CPU everything is float32."""
    if device.type != "cuda" or cfg.model.dtype == "float32":
        return None
    return torch.bfloat16 if cfg.model.dtype == "bfloat16" else torch.float16


# vLLM's tokens/s over batched HF generation's, per kind of device, measured with scripts/bench_generation.py
# (docs/engines.md, "Speed"): `rollout.backend: auto` takes vLLM only where this is above 1. A kind that has
# not been measured gets HF. cpu: SmolLM2-135M, 8 episodes x 2 calls of ~1k-token prompts on a shared 2-core
# machine, the lower of two runs (8.1x and 10.2x; vLLM was also 3.1x and 6.9x HF one call at a time). No GPU
# measurement yet.
MEASURED_VLLM_SPEEDUP: dict[str, float] = {"cpu": 8.1}


def choose_backend(cfg: C.Recipe, model_path: str | os.PathLike[str], device: torch.device) -> tuple[str, str]:
    """`rollout.backend` resolved for this run: ("hf" or "vllm", why). `vllm` asked for where vLLM cannot run the
    model raises; `auto` is vllm only where vLLM can run it and was measured faster here (`MEASURED_VLLM_SPEEDUP`),
    and never with `rollout.deterministic_generation` (HF's one-call-at-a-time mode)."""
    asked = cfg.rollout.backend
    if asked == "hf":
        return "hf", "rollout.backend: hf"
    if asked == "vllm":
        problem = vllm_cannot_run(model_path, device.type)
        if problem:
            raise ValueError(f"rollout.backend: vllm, but {problem}; use rollout.backend hf or auto")
        return "vllm", "rollout.backend: vllm"
    # auto: the cheap reasons first (vllm_cannot_run imports vLLM, which takes seconds)
    if cfg.rollout.deterministic_generation:
        return "hf", "auto: rollout.deterministic_generation computes every call alone, with HF"
    speedup = MEASURED_VLLM_SPEEDUP.get(device.type)
    if speedup is None:
        return "hf", f"auto: vLLM has not been measured against batched HF on {device.type}"
    if speedup <= 1.0:
        return "hf", f"auto: vLLM measured {speedup:.1f}x batched HF's tokens/s on {device.type}"
    problem = vllm_cannot_run(model_path, device.type)
    if problem:
        return "hf", f"auto: {problem}"
    return "vllm", f"auto: vLLM runs this model and measured {speedup:.1f}x batched HF's tokens/s on {device.type}"


def vllm_generator(cfg: C.Recipe, model: Any, tokenizer: Any, path: str | os.PathLike[str],
                   device: torch.device) -> ColocatedVLLM:
    """vLLM generation in this process, from the files the actor was loaded from: one sequence per episode in
    flight, the run's context window and seed."""
    rollout = cfg.rollout
    return colocated_vllm(path, model, tokenizer, device.type, max_model_len=rollout.max_model_len,
                          max_num_seqs=rollout.concurrency, seed=cfg.seed, dtype=cfg.model.dtype,
                          gpu_memory_utilization=rollout.gpu_memory_utilization)


def hf_generator(cfg: C.Recipe, model: Any, tokenizer: Any, device: torch.device,
                 autocast_dtype: torch.dtype | None) -> HFGenerator:
    """HF generation: concurrent episodes' calls batched, or one at a time with `deterministic_generation`."""
    rollout = cfg.rollout
    return HFGenerator(model, tokenizer, device, autocast_dtype,
                       max_batch_size=1 if rollout.deterministic_generation else rollout.generation_batch_size,
                       max_batch_tokens=rollout.generation_batch_tokens)


def enable_gradient_checkpointing(model: Any) -> None:
    """`actor.gradient_checkpointing`: each decoder layer's activations are recomputed in the backward pass
    instead of kept (transformers applies it in train mode only, so generation and log-prob passes are
    unchanged). Non-reentrant checkpointing: it needs no inputs that require grad and keeps RNG state."""
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})


def prepare_model_path(cfg: C.Recipe) -> Path:
    """The model directory; with `model.build_tiny` the tiny random Qwen2, built first when missing (only inside
    the model cache, `seal.tiny_model.prepare_tiny_model`)."""
    path = Path(cfg.model.path)
    if cfg.model.build_tiny:
        from seal.tiny_model import prepare_tiny_model

        return prepare_tiny_model(path, **vars(cfg.model.tiny))  # hidden, layers, seed, heads, kv_heads
    return path if path.exists() else Path(cfg.model.path)  # a hub id: transformers resolves it


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


# Families whose CausalLM logits are exactly `lm_head(final hidden state)` (no logit scaling or soft-capping):
# for them `response_logprobs` runs the LM head on the sampled tokens only.
_PLAIN_LM_HEAD = frozenset({"qwen2", "qwen3", "llama", "mistral"})


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
    """`[B, R]` log-probs of every sampled response token (no grad; zero on observations and padding)."""
    bsz, resp_len = data.batch["responses"].shape
    out = torch.zeros((bsz, resp_len), dtype=torch.float32)
    with torch.no_grad(), _autocast(device, autocast_dtype):
        for start in range(0, bsz, micro):
            rows = list(range(start, min(start + micro, bsz)))
            ids, attn, pos, lr, _ = _trimmed(data, rows)
            mask = data.batch["response_mask"][rows, :lr].to(device)
            logp, _ = response_logprobs(model, ids.to(device), attn.to(device), pos.to(device), mask, temperature)
            out[rows[0]:rows[-1] + 1, :lr] = logp.cpu()
    return out


def actor_logprobs(model: Any, data: Any, cfg: C.Recipe, device: torch.device,
                   autocast_dtype: torch.dtype | None) -> torch.Tensor:
    """`batch_logprobs` of `model` at the training temperature, in the update's micro-batches."""
    return batch_logprobs(model, data, cfg.actor.ppo_micro_batch_size_per_gpu, device, cfg.rollout.temperature or 1.0,
                          autocast_dtype)


def rollout_logprob_check(data: Any, old_logp: torch.Tensor) -> dict[str, float]:
    """verl's check of the rollout engine against the actor (`verl.utils.debug.metrics.calculate_debug_metrics`):
    |exp(log-prob the engine sampled with) - exp(the actor's recomputed log-prob)| over the sampled response
    tokens, as `rollout/probs_diff_{max,mean,std}`. Both compute the same policy on the same tokens, so a large
    difference means stale weights in the engine or tokens that drifted."""
    from verl.utils.debug.metrics import calculate_debug_metrics

    if "rollout_log_probs" not in data.batch:
        return {}
    data.batch["old_log_probs"] = old_logp
    out = calculate_debug_metrics(data)
    if not out.get("training/rollout_probs_diff_valid"):
        return {}
    return {f"rollout/probs_diff_{stat}": float(out[f"training/rollout_probs_diff_{stat}"])
            for stat in ("max", "mean", "std")}


def ppo_update(model: Any, ref_model: Any | None, optimizer: torch.optim.Optimizer, data: Any, cfg: C.Recipe,
               device: torch.device, autocast_dtype: torch.dtype | None = None,
               old_logp: torch.Tensor | None = None) -> dict[str, float]:
    """PPO/GRPO actor update on `data` (advantages already computed and A-Patched); `old_logp`: the actor's
    log-probs of `data` when already computed (`actor_logprobs`).

    Mini-batches: the batch is split into train_batch_size / ppo_mini_batch_size parts (verl: one
    optimizer step per mini-batch of ppo_mini_batch_size tasks × n samples); each is processed in
    micro-batches of `ppo_micro_batch_size_per_gpu` rows with gradient accumulation, the loss
    aggregated over the whole mini-batch (`agg_loss` with the mini-batch's token / sequence count).
    """
    from verl.trainer.ppo.core_algos import agg_loss, compute_policy_loss_vanilla, kl_penalty

    actor = cfg.actor
    if no_learning_signal(data.batch["advantages"], data.batch["response_mask"], actor.entropy_coeff):
        return skipped_update_metrics(optimizer, actor, ref_model is not None)
    temperature = cfg.rollout.temperature or 1.0
    micro = actor.ppo_micro_batch_size_per_gpu
    model.eval()
    if old_logp is None:
        old_logp = actor_logprobs(model, data, cfg, device, autocast_dtype)
    ref_logp = None
    if actor.use_kl_loss and ref_model is not None:
        ref_logp = actor_logprobs(ref_model, data, cfg, device, autocast_dtype)
    model.train()
    advantages = data.batch["advantages"]
    mask = data.batch["response_mask"].float()
    bsz = advantages.shape[0]
    num_mini = max(1, min(bsz, cfg.data.train_batch_size // actor.ppo_mini_batch_size))
    minis = [m.tolist() for m in np.array_split(np.arange(bsz), num_mini)]
    params = [p for p in model.parameters() if p.requires_grad]
    acc: dict[str, list[float]] = {}

    def add(key: str, value: float) -> None:
        acc.setdefault(key, []).append(float(value))

    mode = actor.loss_agg_mode
    for _ in range(actor.ppo_epochs):
        for mini in minis:
            optimizer.zero_grad(set_to_none=True)
            info = {"dp_size": 1, "batch_num_tokens": mask[mini].sum().clamp(min=1.0),
                    "global_batch_size": max(1, int((mask[mini].sum(-1) > 0).sum()))}
            loss_cfg = _LossConfig(actor.clip_ratio_low, actor.clip_ratio_high,
                                   actor.clip_ratio_c, info)
            totals = Counter()
            for start in range(0, len(mini), micro):
                rows = mini[start:start + micro]
                ids, attn, pos, lr, _ = _trimmed(data, rows)
                m = mask[rows, :lr].to(device)
                with _autocast(device, autocast_dtype):
                    logp, entropy = response_logprobs(model, ids.to(device), attn.to(device), pos.to(device), m,
                                                      temperature, with_entropy=actor.entropy_coeff != 0.0)
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
                    loss = loss - actor.entropy_coeff * ent
                    totals["entropy"] += float(ent.detach())
                if ref_logp is not None:
                    kld = kl_penalty(logp, ref_logp[rows, :lr].to(device), actor.kl_loss_type)
                    kl_loss = agg_loss(loss_mat=kld, loss_mask=m, loss_agg_mode=mode, **info)
                    loss = loss + actor.kl_loss_coef * kl_loss
                    totals["kl_loss"] += float(kl_loss.detach())
                loss.backward()
            grad_norm = torch.nn.utils.clip_grad_norm_(params, actor.grad_clip if actor.grad_clip else math.inf)
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
        metrics["actor/kl_coef"] = actor.kl_loss_coef
    metrics["actor/num_mini_batches"] = float(len(minis) * actor.ppo_epochs)
    metrics["actor/update_skipped"] = 0.0
    return metrics


def skipped_update_metrics(optimizer: torch.optim.Optimizer, actor: Any, has_ref: bool) -> dict[str, float]:
    """The metrics of a skipped update (same keys as a real one where they have a value: no loss, no gradient)."""
    log.info("every advantage is zero (no task group has a reward spread): forward/backward skipped, no update")
    metrics = {"actor/pg_loss": 0.0, "actor/grad_norm": 0.0, "actor/lr": float(optimizer.param_groups[0]["lr"]),
               "actor/num_mini_batches": 0.0, "actor/update_skipped": 1.0}
    if actor.use_kl_loss and has_ref:
        metrics["actor/kl_coef"] = actor.kl_loss_coef
    return metrics

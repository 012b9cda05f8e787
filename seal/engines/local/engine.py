"""The embedded `local` engine: SEAL's GRPO training loop in one process (CPU, or one GPU).

Same agent loop, env service, SEAL controller and batching as the verl engine; generation is batched
Hugging Face decoding (`seal/rollout/hf_generation.py`) or a vLLM engine in this process whose weights are
synced after every update (`seal/rollout/vllm_generation.py`; `rollout.backend`, `backend.choose_backend`), and
the policy update uses verl's own loss functions (`actor.py`, on `verl.trainer.ppo.core_algos`).

This module is the step loop; read it top to bottom: `train` (the entry) and `setup` build a `LocalRun`;
`training_step` is one SEAL step, every controller call in order (docs/engines.md, "One training step");
`validate_and_save` its end (validation, the best checkpoint, saving). The jobs it calls live beside it:
`rollouts.py` (the step's tasks, seeded requests, playing episodes, what a step keeps of them), `actor.py`
(log-probs and the PPO/GRPO update, as tensor functions), `checkpoint.py` (checkpoint I/O and exact resume),
`backend.py` (device, precision, generation backend); the supervised warm start, which the verl engine
runs too, is `seal/engines/warm_start.py`.

Determinism: every model call is seeded from (seed, step, request index, prompt length), so a run
resumed from a checkpoint continues as the uninterrupted run. Exactly (bit for bit, on the same device
and thread count) with `rollout.deterministic_generation`, where every call is computed alone; in the
default batched generation a call's logits can differ in the last bits with the batch it shared
(`seal/rollout/hf_generation.py`); vLLM's likewise.
"""

from __future__ import annotations

import logging
import os
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from seal import recipe as C
from seal.core.controller import SealController
from seal.engines.batching import compute_grpo_advantages, group_uids, rollouts_to_dataproto
from seal.engines.checkpoint_policy import prune_local
from seal.engines.data import Task, load_tasks
from seal.engines.local import actor as A
from seal.engines.local import backend as B
from seal.engines.local import checkpoint as K
from seal.engines.local import rollouts as R
from seal.logging_utils import MetricsLogger, progress
from seal.rollout.types import GenerateFn, accuracy_reward
from seal.rollout.vllm_generation import ColocatedVLLM
from seal.run_dir import Checkpoints, RunDir, best_record, improves, transcript_failures_logged, write_transcripts

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
    episodes: R.EpisodePlayer  # plays episodes with the run's generation backend
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
            run.logger.log(validate_and_save(run, 0, validate=True, save=False), 0)
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
    run = RunDir(run_dir)
    run.root.mkdir(parents=True, exist_ok=True)
    random.seed(cfg.seed)
    np.random.seed(cfg.seed % (2**32))
    torch.manual_seed(cfg.seed)
    device = B.pick_device()
    autocast_dtype = B.autocast_dtype(cfg.model.dtype, device)

    train_tasks = load_tasks(cfg.data.train_files, cfg.data.max_train_tasks, cfg.data.train_task_ids)
    val_tasks = load_tasks(cfg.data.val_files, cfg.data.max_val_tasks, cfg.data.val_task_ids)
    total_steps = C.total_training_steps(cfg, len(train_tasks))
    spe = C.steps_per_epoch(cfg, len(train_tasks))

    base_path = Path(C.model_dir(cfg))  # a built-in model, the tiny model, a local directory or a hub id
    if cfg.model.warm_start.enable:  # the starting policy (and the KL reference) is the warm-started model
        from seal.engines.warm_start import build_warm_start

        base_path = build_warm_start(cfg, base_path, train_tasks)
    resume_from = K.resume_point(cfg.trainer.resume, run)
    load_path = resume_from if resume_from is not None else base_path
    tokenizer, model, ref_model = load_models(load_path, base_path, cfg.actor, device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.actor.lr, weight_decay=cfg.actor.weight_decay)
    controller = SealController(cfg.seal)
    start_step, best = 0, None
    if resume_from is not None:
        start_step, best = K.restore_checkpoint(resume_from, optimizer, controller,
                                                force=cfg.trainer.resume not in ("auto", "disable"))

    logger = MetricsLogger(run.root, list(cfg.trainer.logger), resume_step=start_step if resume_from else None,
                           wandb_project=cfg.trainer.wandb_project, experiment_name=cfg.experiment_name,
                           config=C.to_container(cfg))
    vllm = None
    if generate_factory is not None:
        generate = generate_factory(model, tokenizer, device)
    else:
        backend, why = B.choose_backend(cfg.rollout, load_path, device)
        log.info("rollout backend: %s (%s)", backend, why)
        if backend == "vllm":
            generate = vllm = B.vllm_generator(cfg.rollout, cfg.seed, cfg.model.dtype, model, tokenizer, load_path,
                                               device)
            log.info("rollout backend: %s", vllm.describe())
        else:
            generate = B.hf_generator(cfg.rollout, model, tokenizer, device, autocast_dtype)
    episodes = R.EpisodePlayer(cfg.env, C.rollout_limits(cfg), cfg.rollout.concurrency, generate, tokenizer,
                               service_log=run.env_service_log)
    pad_id = int(tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id)
    log.info("local engine: %d train tasks, %d val tasks, %d steps (%d per epoch), device %s, run %s",
             len(train_tasks), len(val_tasks), total_steps, spe, device, controller.run_id)
    if start_step >= total_steps:
        log.info("the run in %s is already complete (step %d of %d); trainer.resume=disable starts it over",
                 run.root, start_step, total_steps)
    return LocalRun(cfg=cfg, run=run, device=device, autocast_dtype=autocast_dtype, tokenizer=tokenizer, model=model,
                    ref_model=ref_model, optimizer=optimizer, controller=controller, episodes=episodes, vllm=vllm,
                    logger=logger, train_tasks=train_tasks, val_tasks=val_tasks, total_steps=total_steps,
                    steps_per_epoch=spe, pad_id=pad_id, start_step=start_step, resumed=resume_from is not None,
                    best=best)


def load_models(load_path: Path, base_path: Path, actor: C.ActorConfig, device: torch.device
                ) -> tuple[Any, Any, Any | None]:
    """(tokenizer, policy, KL reference) in float32 on `device`: the policy from `load_path` (a checkpoint when
    resuming), the frozen reference from `base_path` when `actor.use_kl_loss`."""
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # per-save/load shard bars would drown the step bars
    tokenizer = AutoTokenizer.from_pretrained(str(load_path))
    model = AutoModelForCausalLM.from_pretrained(str(load_path), dtype=torch.float32).to(device)
    if actor.gradient_checkpointing:
        A.enable_gradient_checkpointing(model)
    model.eval()
    ref_model = None
    if actor.use_kl_loss:
        ref_model = AutoModelForCausalLM.from_pretrained(str(base_path), dtype=torch.float32).to(device)
        ref_model.eval().requires_grad_(False)
    return tokenizer, model, ref_model


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
    epoch, index, tasks = R.step_tasks(run.train_tasks, step, cfg.data, cfg.seed, controller.repair)

    # 1. Episodes on Ω_t: each task rollout.n times, sampled; the controller turns each reply into a reward.
    controller.set_training_progress(step - 1, run.total_steps, run.steps_per_epoch)
    omega = controller.interface("train")
    params = C.sampling_params(cfg, "train")
    requests = R.training_requests(tasks, omega, params, step, cfg.rollout.n, cfg.seed)
    t0 = time.perf_counter()
    rollouts = run.episodes.play(requests, params, controller.reward_fn, f"rollouts@{step}")
    metrics: dict[str, float] = {"timing/rollout": time.perf_counter() - t0,
                                 "train/epoch": float(epoch), "train/step_in_epoch": float(index)}

    with transcript_failures_logged(step):
        write_transcripts(run.run.transcripts_file(step), R.transcript_entries(rollouts, run.tokenizer))

    # 2. C_t: the capability state observes the step's non-excluded rollouts.
    metrics |= controller.observe([r.record() for r in rollouts], step)
    metrics |= R.rollout_metrics(rollouts)

    # 3. GRPO advantages per task group, A-Patch reweighting, the PPO update (excluded rollouts train nothing).
    kept = [r for r in rollouts if not r.excluded]
    if kept:
        t0 = time.perf_counter()
        data = rollouts_to_dataproto(kept, run.pad_id, uids=group_uids(kept, step))
        compute_grpo_advantages(data, cfg.algorithm.norm_adv_by_std_in_grpo)
        metrics |= controller.reweight(data, step)
        metrics["train/advantage_abs_mean"] = A.advantage_abs_mean(data)
        metrics["train/mixed_group_frac"] = R.mixed_group_frac(kept)
        temperature = cfg.rollout.temperature or 1.0  # log-probs of the distribution the episodes were sampled from
        old_logp = None
        if run.vllm is not None:  # verl's check of the rollout engine against the actor, on every step
            old_logp = A.batch_logprobs(run.model, data, cfg.actor.ppo_micro_batch_size_per_gpu, run.device,
                                        temperature, run.autocast_dtype)
            metrics |= A.rollout_logprob_check(data, old_logp)
        metrics |= A.ppo_update(run.model, run.ref_model, run.optimizer, data, cfg.actor, temperature=temperature,
                                train_batch_size=cfg.data.train_batch_size, device=run.device,
                                autocast_dtype=run.autocast_dtype, old_logp=old_logp)
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

    # 5. Validation every test_freq steps and at the last one (0: the last only, -1: never); a checkpoint every
    #    save_freq steps, at the last one and on a new best.
    last = step == run.total_steps
    test_freq, save_freq = cfg.trainer.test_freq, cfg.trainer.save_freq
    metrics |= validate_and_save(run, step, validate=C.validates_at(test_freq, step, last),
                                 save=last or (save_freq > 0 and step % save_freq == 0))
    metrics["timing/step"] = time.perf_counter() - t_step
    return metrics


# =========================================================================== validation and checkpoints
def validate_and_save(run: LocalRun, step: int, validate: bool, save: bool) -> dict[str, float]:
    """The end of step `step` (0: before training): greedy validation on the raw interface when `validate`
    (n = rollout.val_n; `validation/step_<N>.jsonl`), a new best by `trainer.best_metric`
    (`seal.run_dir.improves`), and a checkpoint when `save` or on a new best. Returns their metrics."""
    cfg = run.cfg
    metrics: dict[str, float] = {}
    improved = False
    if validate:
        t0 = time.perf_counter()
        params = C.sampling_params(cfg, "val")
        requests = R.validation_requests(run.val_tasks, params, step, cfg.rollout.val_n, cfg.seed)
        rollouts = run.episodes.play(requests, params, accuracy_reward, f"validation@{step}")
        metrics |= SealController.validation_metrics([r.record() for r in rollouts])
        metrics |= R.rollout_metrics(rollouts, "val_rollout/")
        metrics["timing/validation"] = time.perf_counter() - t0
        R.write_validation(run.run.validation_file(step), rollouts)
        key = cfg.trainer.best_metric
        value = metrics.get(key)
        improved = improves(value, None if run.best is None else run.best["value"])
        if improved:
            run.best = best_record(step, Checkpoints.ref(step), key, float(value))
    if save or improved:
        t0 = time.perf_counter()
        state = K.trainer_state(step, run.steps_per_epoch, run.total_steps, run.best, run.controller.run_id)
        K.save_checkpoint(run.run, step, run.model, run.tokenizer, run.optimizer, run.controller, state)
        if improved:
            run.run.checkpoints.write_best(run.best)
        prune_local(run.run.checkpoints, cfg.trainer.keep_full_checkpoints)  # after best.json: the best stays full
        metrics["timing/checkpoint"] = time.perf_counter() - t0
    return metrics

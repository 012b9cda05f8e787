"""The local engine's episodes: which tasks a step trains on, the seeded requests, playing them against the env
service, and what a step logs and keeps of them (metrics, transcripts, validation records)."""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch

from seal.core.adaptive import RepairStats
from seal.core.curriculum import draw_batch
from seal.engines.data import Task
from seal.logging_utils import progress
from seal.recipe import DataConfig, EnvConfig
from seal.rollout.client import EnvClient
from seal.rollout.episode import EpisodeRequest, check_infra_loss, run_batch
from seal.rollout.types import GenerateFn, Rollout, RolloutLimits, SamplingParams
from seal.run_dir import transcript_entry, transcript_sample, validation_entry


# --------------------------------------------------------------------------- data order
def epoch_order(num_tasks: int, epoch: int, seed: int, shuffle: bool) -> list[int]:
    """Task indices of one epoch: a permutation seeded by (seed, epoch), or file order."""
    if not shuffle:
        return list(range(num_tasks))
    gen = torch.Generator().manual_seed(int(seed) * 1_000_003 + int(epoch))
    return torch.randperm(num_tasks, generator=gen).tolist()


def step_tasks(tasks: Sequence[Task], step: int, data: DataConfig, seed: int,
               repair: RepairStats | None = None) -> tuple[int, int, list[Task]]:
    """(epoch, batch index, tasks) of global step `step` (1-based); full batches only (drop_last: an epoch is
    len(tasks) // train_batch_size steps). `data.sampler: failure_profile` draws the batch from `repair`
    (seal.core.curriculum) instead."""
    size = data.train_batch_size
    if len(tasks) < size:
        raise ValueError(f"{len(tasks)} training tasks are fewer than data.train_batch_size = {size}")
    epoch, index = divmod(step - 1, len(tasks) // size)
    if data.sampler == "failure_profile":
        if repair is None:
            raise ValueError("data.sampler: failure_profile needs the controller's repair statistics")
        rows = draw_batch([t.task_id for t in tasks], repair, data.sampler_floor, size, seed, step)
        return epoch, index, [tasks[i] for i in rows]
    order = epoch_order(len(tasks), epoch, seed, data.shuffle)
    return epoch, index, [tasks[i] for i in order[index * size:(index + 1) * size]]


# --------------------------------------------------------------------------- requests
def episode_seed(base: int, step: int, index: int) -> int:
    """The seed of request `index` of step `step`: a run resumed at any step samples what the whole run would."""
    return ((int(base) * 1_000_003 + int(step)) * 100_003 + int(index)) % (2**62)


def training_requests(tasks: Sequence[Task], omega: dict | None, params: SamplingParams, step: int, n: int,
                      seed: int) -> list[EpisodeRequest]:
    """Each task `n` times (consecutive rows: one GRPO group), each episode seeded by its index."""
    reqs: list[EpisodeRequest] = []
    for t in tasks:
        for _ in range(n):
            reqs.append(EpisodeRequest(t.task_id, "train", omega,
                                       replace(params, seed=episode_seed(seed, step, len(reqs)))))
    return reqs


def validation_requests(tasks: Sequence[Task], params: SamplingParams, step: int, n: int,
                        seed: int) -> list[EpisodeRequest]:
    """Each validation task `n` times on the raw interface, seeded apart from every training step's episodes."""
    return [EpisodeRequest(t.task_id, "eval", None, replace(params, seed=episode_seed(seed, -1 - step, i)))
            for i, t in enumerate(t for t in tasks for _ in range(n))]


# --------------------------------------------------------------------------- playing
@dataclass
class EpisodePlayer:
    """Plays batches of episodes against the env service with the run's policy (`generate`)."""

    env: EnvConfig
    limits: RolloutLimits
    concurrency: int
    generate: GenerateFn
    tokenizer: Any
    service_log: Path | None = None  # named in the error when the service lost episodes

    def play(self, requests: list[EpisodeRequest], params: SamplingParams, reward_fn: Callable[[dict], float],
             desc: str) -> list[Rollout]:
        """The episodes of `requests` (one event loop per batch), with a progress bar."""
        return asyncio.run(self._play(requests, params, reward_fn, desc))

    async def _play(self, requests: list[EpisodeRequest], params: SamplingParams,
                    reward_fn: Callable[[dict], float], desc: str) -> list[Rollout]:
        env = self.env
        bar = progress(len(requests), desc)
        try:
            async with EnvClient(list(env.urls), timeout=env.timeout_s, max_retries=env.max_retries) as client:
                rollouts = await run_batch(client, self.generate, self.tokenizer, requests, params, self.limits,
                                           concurrency=self.concurrency, reward_fn=reward_fn,
                                           max_restarts=env.max_restarts, on_done=lambda i, r: bar.update(1))
            # Loud, never a silent run.
            check_infra_loss([r.record() for r in rollouts], env.max_infra_loss, ", ".join(env.urls),
                             self.service_log)
            return rollouts
        finally:
            bar.close()


# --------------------------------------------------------------------------- what a step keeps
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


def transcript_entries(rollouts: Sequence[Rollout], tokenizer: Any) -> list[dict[str, Any]]:
    """The step's transcript sample (`seal.run_dir.transcript_sample`), each a `seal.run_dir.transcript_entry`
    decoded with the policy's tokenizer, as the verl engine writes it."""
    return [transcript_entry(r.record(), tokenizer, r.prompt_ids, r.response_ids)
            for r in (rollouts[i] for i in transcript_sample([r.task_id for r in rollouts]))]


def write_validation(path: Path, rollouts: Sequence[Rollout]) -> None:
    """`validation/step_<N>.jsonl`: one line per validation episode (`seal.run_dir.validation_entry`)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8") as fh:
        for r in rollouts:
            fh.write(json.dumps(validation_entry(r.record(), num_model_calls=r.num_model_calls)) + "\n")

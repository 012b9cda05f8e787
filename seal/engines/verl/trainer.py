"""verl trainer mode `seal` (`trainer.v1.trainer_mode=seal`): verl's synchronous v1 PPO trainer plus SEAL.

`SealTrainer` is verl's `PPOTrainerSync` (colocated FSDP actor + vLLM rollout, weights synced every
step), opened by `seal.engines.verl.adapter.TrainerAdapter`, with the SEAL step of
`seal.core.controller.SealController` (docs/seal_core.md, docs/verl_engine.md). `SealTrainer.step` is
the step, top to bottom; verl's `fit` loop drives it and then validates and saves on its cadence.

The mode runs synchronously (`trainer_mode` reads "sync" for verl's own checks): SEAL's closed loop needs
Ω_{t+1} in place before step t+1's episodes start.
"""

from __future__ import annotations

import json
import logging
import math
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from omegaconf import DictConfig
from verl.protocol import DataProto
from verl.trainer.ppo.ray_trainer import compute_advantage
from verl.trainer.ppo.v1.trainer_base import register_trainer
from verl.trainer.ppo.v1.utils import compute_advantage_for_multi_trajectories

from seal import recipe as C
from seal.core.controller import STATE_FILE, SealController
from seal.core.record import EpisodeRecord, record_columns
from seal.engines.advantage_record import ADVANTAGES_FILE, append_record, row_values, step_record
from seal.engines.verl.adapter import TrainerAdapter
from seal.engines.verl.agent_loop import EPISODE_TOKENS_KEY, EpisodeFeed
from seal.engines.verl.config import TRAINER_MODE
from seal.engines.warm_start import probe_episodes
from seal.rollout.episode import check_infra_loss
from seal.run_dir import (
    Checkpoints,
    RunDir,
    best_record,
    improves,
    transcript_entry,
    validation_entry,
    write_transcripts,
)

log = logging.getLogger(__name__)
# verl's convention (its modules do the same): INFO by default inside Ray workers, whose root logger verl sets
# to WARNING; the trainer runs in the TaskRunner actor and "resumed SEAL state" must reach the run's log.
log.setLevel(os.getenv("VERL_LOGGING_LEVEL", "INFO"))

EXCLUDED_UID_PREFIX = "seal-excluded:"


@register_trainer(TRAINER_MODE)
class SealTrainer(TrainerAdapter):
    """verl's synchronous v1 trainer with the SEAL step (module docstring)."""

    def __init__(self, config: DictConfig):
        seal = config.get("seal")
        if seal is None or seal.get("recipe") is None:
            raise ValueError("trainer mode 'seal' needs the recipe under `seal.recipe` "
                             "(build the config with seal.engines.verl.config.to_verl_config)")
        if config.algorithm.adv_estimator != "grpo":
            raise ValueError("A-Patch rescales GRPO advantages: algorithm.adv_estimator must be grpo")
        super().__init__(config)
        self.recipe = C.from_container(seal.recipe)
        self.run = RunDir(str(seal.run_dir))
        self.controller = SealController(self.recipe.seal)
        self.best: dict[str, Any] | None = None
        self.last_validation: dict[str, float] = {}
        episodes = probe_episodes(str(config.actor_rollout_ref.model.path))  # a warm-started model's, else None
        self.probe = WeightProbe(episodes) if episodes else None
        self.served = ServedRequests()

    # ================================================================== the SEAL step
    def step(self, metrics: dict, timing_raw: dict) -> Any:
        """Training step `global_steps`, top to bottom (verl's `fit` calls it once per step)."""
        step = self.global_steps
        # 1. Training progress (reward modes with a decaying cap) before verl submits the step's batch;
        #    `episode_feed` stamps every submitted batch with it and with Ω_t.
        self.controller.set_training_progress(step - 1, self.total_training_steps, self.steps_per_epoch)
        # 2. verl's step: the batch's episodes in the `seal_bfcl` agent loops (on Ω_t, rewarded by the
        #    episodes' evaluate replies) -> old / reference log-probs -> `advantage_step` below
        #    (controller.observe = C_t, GRPO, controller.reweight = A-Patch) -> the actor update.
        batch = super().step(metrics, timing_raw)
        # 3. Ω_{t+1} from C_t, before verl saves this step's checkpoint (so a resume continues with it);
        #    the capability window restarts at an epoch end.
        metrics.update(self.controller.evolve(step))
        if self.steps_per_epoch > 0 and step % self.steps_per_epoch == 0:
            self.controller.end_epoch()
        # 4. Then verl saves at save_freq (`on_step_end`: also the last step) and validates at test_freq
        #    and the last step (`validation_metrics`, `on_validate_end`: best.json).
        return batch

    def episode_feed(self, validate: bool) -> EpisodeFeed:
        """How the agent loops run the episodes of the batch being submitted: training on Ω_t,
        validation (verl marks those batches) in eval mode on the raw interface."""
        if validate:
            return EpisodeFeed(mode="eval", interface=None, training_progress=self.controller.training_progress)
        return EpisodeFeed(mode="train", interface=self.controller.interface("train"),
                           training_progress=self.controller.training_progress)

    def advantage_step(self, data: DataProto, records: list[EpisodeRecord | None], batch_keys: list[str],
                       metrics: dict) -> None:
        """C_t from the step's real rollouts, then GRPO and A-Patch on the batch (`seal_advantages`)."""
        episodes = [r for r in records if r is not None]  # None: verl's padding rows
        check_infra_loss(episodes, self.recipe.env.max_infra_loss, ", ".join(self.recipe.env.urls),
                         self.run.env_service_log)
        metrics.update(self.controller.observe(episodes, self.global_steps))
        grpo: list[tuple[float | None, float]] = []
        metrics.update(seal_advantages(data, records, self.controller, self.global_steps,
                                       algorithm=self.config.algorithm,
                                       num_repeat=int(self.config.actor_rollout_ref.rollout.n),
                                       batch_keys=batch_keys, grpo_rows=grpo))
        # `<run>/advantages.jsonl`: what the update is given, checkable against GRPO × A-Patch from outside.
        append_record(self.run.root / ADVANTAGES_FILE, advantage_step_record(
            data, grpo, self.controller, self.global_steps, self.config.algorithm))

    def weights_synced(self) -> dict[str, float]:
        """After every weight sync: the requests each vLLM replica served since the last sync (when the servers
        keep statistics), then the weight probe read from every replica (a warm-started model only). The counts
        are read before the probe and again after it, so the probe's own requests are not counted."""
        metrics: dict[str, float] = {}
        addresses = self.rollout_server_addresses() if self.config.actor_rollout_ref.rollout.get(
            "disable_log_stats") is False else []
        if addresses:
            metrics.update(self.served.since_last([server_request_count(a) for a in addresses]))
        if self.probe is not None:
            metrics.update(self.probe.measure(self.rollout_prompt_logprobs))
        if addresses:
            self.served.reset([server_request_count(a) for a in addresses])
        return metrics

    def on_step_end(self) -> None:
        super().on_step_end()
        # docs/config.md: the last step is always saved; verl saves only when save_freq > 0.
        if self.config.trainer.save_freq <= 0 and self.global_steps >= self.total_training_steps:
            self.save_checkpoint()

    # ================================================================== validation and the best checkpoint
    def validation_metrics(self, records: list[EpisodeRecord], infos: Mapping[str, Sequence[Any]]) -> dict[str, float]:
        self.last_validation = self.controller.validation_metrics(records)
        write_validation_tokens(self.run.validation_file(self.global_steps), records, infos)
        return self.last_validation

    def on_validate_end(self) -> None:
        super().on_validate_end()
        self.update_best(self.last_validation)

    def update_best(self, val: Mapping[str, float]) -> None:
        """`best.json` on a new best of `trainer.best_metric` (`seal.run_dir.improves`); a best at a step
        without a checkpoint saves one, a best at step 0 names the base model."""
        key = self.recipe.trainer.best_metric
        if key not in val:
            log.warning("best checkpoint: validation has no %s", key)
            return
        value = float(val[key])
        if not improves(value, None if self.best is None else float(self.best["value"])):
            return
        step = int(self.global_steps)
        if step == 0:
            path = self.recipe.model.path  # the base model, before any update
        else:
            if not self.checkpoints.verl_step_dir(step).is_dir():
                self.save_checkpoint()
            self.saves.join()  # best.json names a signed save only (the signing runs in the background)
            path = Checkpoints.ref(step)
        self.best = best_record(step, path, key, value)
        self.checkpoints.write_best(self.best)
        if step > 0:
            self.saves.settle()  # the former best is no longer kept whole (checkpoint policy)

    # ================================================================== checkpoints and metrics
    def checkpoint_saved(self, step: int, checkpoints: Checkpoints) -> None:
        # Into the folder before it is signed; the `step_N` link and latest.json follow its signing
        # (`seal.engines.checkpoint_policy.SaveSigner`).
        self.controller.save(checkpoints.verl_step_dir(step))

    def keep_transcripts(self, records: list[EpisodeRecord], tokens: list[tuple[list[int], list[int]]]) -> None:
        """`<run>/transcripts/step_<N>.jsonl`: the kept episodes as the model saw them, decoded with its
        tokenizer (chat template and special tokens included): the prompt's end, the response's start.
        The tokenizer is verl's (`self.tokenizer`, loaded by `PPOTrainer.init`): one per run."""
        tokenizer = self.tokenizer
        entries = [transcript_entry(r, tokenizer, prompt, response)
                   for r, (prompt, response) in zip(records, tokens, strict=True)]
        write_transcripts(self.run.transcripts_file(self.global_steps), entries)

    def checkpoint_loaded(self, step: int, folder: Path) -> None:
        if not (folder / STATE_FILE).is_file():
            raise FileNotFoundError(
                f"resuming from {folder}: no {STATE_FILE} (the capability state, Ω and A-Patch weights). "
                "Set trainer.resume=disable to start afresh.")
        self.controller.load(folder)
        best = self.checkpoints.read_best()
        if best is not None:
            self.best = best
        log.info("resumed SEAL state from %s (step %d)", folder, step)

    def metrics_jsonl_path(self) -> Path | None:
        return self.run.metrics_file if "jsonl" in list(self.recipe.trainer.logger) else None


def write_validation_tokens(path: Path, records: Sequence[EpisodeRecord], infos: Mapping[str, Sequence[Any]]) -> None:
    """`<run>/validation/step_<N>.jsonl` of the verl engine: one line per validation episode (its record,
    `seal.run_dir.validation_entry`) with its token ids as sampled (`prompt_ids`, `response_ids`,
    `response_mask`; null for an episode that never ran), from the agent loop's `EPISODE_TOKENS_KEY`. What a
    check of the run's greedy episodes against `seal-eval --policy vllm:` reads (`seal.eval.same_tokens`)."""
    tokens = list(infos.get(EPISODE_TOKENS_KEY, []))
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8") as fh:
        for i, r in enumerate(records):
            seq = json.loads(tokens[i]) if i < len(tokens) and tokens[i] else {}
            fh.write(json.dumps(validation_entry(r, prompt_ids=seq.get("prompt_ids"),
                                                 response_ids=seq.get("response_ids"),
                                                 response_mask=seq.get("response_mask"))) + "\n")


# =========================================================================== the weight probe
class WeightProbe:
    """What the vLLM servers that serve the rollouts compute for fixed token sequences, after every weight sync.

    The sequences are the learnt episodes of a warm-started model (`seal.engines.warm_start.probe_episode`:
    each training task's ground truth and failing twin, as tokens). Per episode p = exp(sum of its reply tokens'
    log-probs), the exact probability that sampling at temperature 1 reproduces its replies, as the local engine's
    warm start measures it, here from the rollout servers' weights. Every replica is read (`prompt_logprobs` gives
    one list per replica): the probabilities are replica 0's, and `probe/replica_max_diff` is the largest
    difference of any token's log-prob between replica 0 and another (every replica holds the same weights: ~0).
    Between two syncs the log-probs of every token of every episode are compared, per replica: after a real update
    they change (the server holds the new weights), after a skipped one they do not.

    Metrics: `probe/p_ground_truth/<task>`, `probe/p_twin/<task>`, `probe/p_ground_truth/mean`, `probe/logprob`
    (the sum of every episode's reply log-prob), `probe/replicas`, `probe/replica_max_diff`, and from the second
    sync on `probe/logprob_change` (against the sync before), `probe/max_token_change` (the largest change of any
    token's log-prob, replica 0) and `probe/replica_<r>/max_token_change` for every replica. The first sync's
    (the starting weights: the warm start, or a resumed checkpoint) are named `probe/start/...`.
    """

    def __init__(self, episodes: Sequence[Mapping[str, Any]]):
        self.episodes = list(episodes)
        self.last: list[list[list[float]]] | None = None  # [replica][episode][token]

    def measure(self, prompt_logprobs: Callable[[Sequence[int]], list[list[float]]]) -> dict[str, float]:
        """`prompt_logprobs(ids)`: per replica, the log-probs of ids[1:] (`TrainerAdapter.rollout_prompt_logprobs`)."""
        per_episode = [prompt_logprobs(e["token_ids"]) for e in self.episodes]  # [episode][replica][token]
        replicas = len(per_episode[0])
        if replicas < 1 or any(len(r) != replicas for r in per_episode):
            raise RuntimeError(f"the weight probe got {[len(r) for r in per_episode]} replica answers per episode")
        now = [[per_episode[i][r] for i in range(len(self.episodes))] for r in range(replicas)]
        metrics: dict[str, float] = {"probe/replicas": float(replicas),
                                     "probe/replica_max_diff": _max_abs_diff(now[0], now)}
        reply_logps, gt_probs = [], []
        for e, logps in zip(self.episodes, now[0], strict=True):
            logp = math.fsum(logps[p - 1] for p in e["reply_positions"])  # logps[i] is token i + 1's
            reply_logps.append(logp)
            metrics[f"probe/p_{e['kind']}/{e['task_id']}"] = math.exp(logp)
            if e["kind"] == "ground_truth":
                gt_probs.append(math.exp(logp))
        metrics["probe/logprob"] = math.fsum(reply_logps)
        if gt_probs:
            metrics["probe/p_ground_truth/mean"] = sum(gt_probs) / len(gt_probs)
        if self.last is not None:
            if len(self.last) != replicas:
                raise RuntimeError(f"the weight probe read {replicas} replicas, {len(self.last)} at the sync before")
            before = [math.fsum(lp[p - 1] for p in e["reply_positions"]) for e, lp in zip(self.episodes,
                                                                                          self.last[0], strict=True)]
            metrics["probe/logprob_change"] = metrics["probe/logprob"] - math.fsum(before)
            for r in range(replicas):
                metrics[f"probe/replica_{r}/max_token_change"] = _max_abs_diff(self.last[r], [now[r]])
            metrics["probe/max_token_change"] = metrics["probe/replica_0/max_token_change"]
        start = self.last is None
        self.last = now
        return {k.replace("probe/", "probe/start/", 1): v for k, v in metrics.items()} if start else metrics


def _max_abs_diff(reference: list[list[float]], others: Sequence[list[list[float]]]) -> float:
    """The largest |a - b| between a token log-prob of `reference` ([episode][token]) and the same token's in any
    of `others`."""
    return max((abs(a - b) for other in others for ref_e, e in zip(reference, other, strict=True)
                for a, b in zip(ref_e, e, strict=True)), default=0.0)


class ServedRequests:
    """Requests each vLLM replica finished between two readings of vLLM's own counters: the agent loop's requests
    counted per replica (`rollout/server_requests/replica_<r>`), so a run shows that every replica serves."""

    def __init__(self) -> None:
        self.last: list[float] | None = None

    def since_last(self, counts: Sequence[float]) -> dict[str, float]:
        before = self.last if self.last is not None else [0.0] * len(counts)
        if len(before) != len(counts):
            raise RuntimeError(f"{len(counts)} vLLM replicas answer now, {len(before)} did before")
        return {f"rollout/server_requests/replica_{r}": now - then
                for r, (now, then) in enumerate(zip(counts, before, strict=True))}

    def reset(self, counts: Sequence[float]) -> None:
        self.last = list(counts)


def server_request_count(address: str, timeout_s: float = 10.0) -> float:
    """Requests the vLLM server at `host:port` has finished (`vllm:request_success_total`, summed over its finish
    reasons), from its Prometheus endpoint. Never through a proxy (the servers are on this node's loopback); an
    unreachable server or a missing counter is an error naming the address."""
    from env_service.process import DIRECT

    url = f"http://{address}/metrics"
    try:
        with DIRECT.open(url, timeout=timeout_s) as reply:
            text = reply.read().decode()
    except OSError as exc:
        raise RuntimeError(f"could not read the vLLM server's request counter at {url}: {exc}") from exc
    counts = [float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
              if line.startswith("vllm:request_success_total")]
    if not counts:
        raise RuntimeError(f"{url} has no vllm:request_success_total (does the server keep statistics?)")
    return math.fsum(counts)


# =========================================================================== the advantage computation
def advantage_step_record(data: DataProto, grpo: Sequence[tuple[float | None, float]], controller: SealController,
                          step: int, algorithm: Any) -> dict[str, Any]:
    """The step's line of `advantages.jsonl` (seal.engines.advantage_record), after `seal_advantages` ran on
    `data`: A-Patch's knobs and the weights it used this step (`update_weights` returns the step's weights
    again: they move once per step)."""
    cfg = controller.apatch_cfg
    apatch = {"enabled": bool(cfg.enable), "warmup_steps": int(cfg.warmup_steps), "apply_to": cfg.apply_to,
              "min_scale": float(cfg.min_scale), "max_scale": float(cfg.max_scale), "tags_column": cfg.tags_column,
              "weights": dict(controller.update_weights(step)) if cfg.enable else {}}
    excluded = [bool(x) for x in data.non_tensor_batch["excluded"]]
    return step_record(step, data, grpo, apatch, bool(algorithm.get("norm_adv_by_std_in_grpo", True)),
                       controller.adaptive_cfg.task_weights, excluded)


def seal_advantages(
    data: DataProto,
    records: Sequence[EpisodeRecord | None],
    controller: SealController,
    step: int,
    *,
    algorithm: Any,
    num_repeat: int,
    batch_keys: Sequence[str] | None = None,
    grpo_rows: list[tuple[float | None, float]] | None = None,
) -> dict[str, float]:
    """GRPO through verl, then A-Patch through the controller; `data.batch["advantages"]` is replaced.

    Args:
        data: `batch["token_level_rewards"]`, `batch["response_mask"]` ([B, R]) and
            `non_tensor_batch["uid"]` (one GRPO group per prompt), as verl builds them.
        records: per row, the episode's record (read from the agent loop's `extra_fields`; None for verl's
            padding rows).
        controller: the run's `SealController` (`observe` must already have run for `step`).
        step: the global step (A-Patch warm-up, once-per-step dynamic-weight update).
        algorithm: verl's `algorithm` config (adv_estimator, norm_adv_by_std_in_grpo, gamma, lam).
        num_repeat: rollouts per prompt (`actor_rollout_ref.rollout.n`).
        batch_keys: TransferQueue keys `{uid}_{session}_{index}` (v1 path: verl's multi-trajectory
            GRPO); None = verl's plain `compute_advantage`.
        grpo_rows: filled, when given, with each row's GRPO advantage before A-Patch
            (`seal.engines.advantage_record.row_values`: excluded rows already zeroed).

    Excluded rows (and padding rows) get a uid of their own, so they do not enter the mean/std of the
    real groups (a lone member gets mean 0, std 1 in verl), and their advantages are zeroed.
    Returns the A-Patch metrics plus `seal/excluded_rows`.
    """
    if len(records) != len(data):
        raise ValueError(f"{len(records)} records for {len(data)} rows")
    columns = record_columns(records)  # the same columns the local engine's batch carries
    excluded = columns["excluded"].astype(bool)
    uids = np.array(data.non_tensor_batch["uid"], dtype=object)
    for i in np.flatnonzero(excluded):
        uids[i] = f"{EXCLUDED_UID_PREFIX}{i}:{uids[i]}"
    data.non_tensor_batch["uid"] = uids
    for name, column in columns.items():
        data.non_tensor_batch[name] = column

    kwargs = dict(adv_estimator=algorithm.adv_estimator, gamma=algorithm.gamma, lam=algorithm.lam,
                  num_repeat=num_repeat,
                  norm_adv_by_std_in_grpo=bool(algorithm.get("norm_adv_by_std_in_grpo", True)), config=algorithm)
    if batch_keys is None:
        out = compute_advantage(data, **kwargs)
    else:
        out = compute_advantage_for_multi_trajectories(data, batch_keys=list(batch_keys), **kwargs)
    if out is not data:  # verl returns the same object today; keep ours authoritative either way
        data.batch["advantages"], data.batch["returns"] = out.batch["advantages"], out.batch["returns"]
    keep = torch.as_tensor(~excluded, dtype=data.batch["advantages"].dtype).unsqueeze(-1)
    data.batch["advantages"] = data.batch["advantages"] * keep
    data.batch["returns"] = data.batch["returns"] * keep
    if grpo_rows is not None:
        grpo_rows[:] = row_values(data.batch["advantages"], data.batch["response_mask"])

    metrics = controller.reweight(data, step)
    metrics["seal/excluded_rows"] = float(excluded.sum())
    return metrics

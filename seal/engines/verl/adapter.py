"""Every use of verl's private API by the trainer in one place, written for verl 0.9.1 and checked at import.

The rest of `seal/engines/verl` uses verl's public API only (config keys, `DataProto`, the advantage
functions of `verl.trainer.ppo`, the agent-loop base class, the registration decorators, the
trainer's public hooks `fit`/`step`/`on_*` and attributes such as `tokenizer`) plus this module, except
the CPU path's patches (`seal/engines/verl/cpu_patches.py`, with a table of its own);
tests/engines/test_verl_adapter.py scans the sources to keep it so. When verl is upgraded, this table is
the list to re-check:

what                       where in verl 0.9.1  ->  why
-------------------------  --------------------------------------------------------------------------------
`trainer_mode` property    `PPOTrainer.__init__` sets it from `trainer.v1.trainer_mode`; the replay buffer,
                           data loader, checkpointing and refills test `== "sync"`
                           -> our mode is registered as "seal" but must take the synchronous path
                           (Ω_{t+1} exists before step t+1's episodes start)
`logger` property          `PPOTrainer.fit` assigns `self.logger = Tracking(...)` after loading a checkpoint
                           -> every logged dict also goes to `<run>/metrics.jsonl` (`MetricsLog`), the file
                           trimmed to the resumed step
`fit` (wraps the manager)  every submission (training, refills, validation) calls
                           `agent_loop_manager.generate_sequences(batch)`; `_validate` marks its batches
                           with `validate`  -> `FeedingManager` stamps each batch with its episode feed
                           (mode, Ω_t, training progress)
`_compute_advantage`       step 7 of `PPOTrainer._step_once`; the batch is a `KVBatchMeta` whose rows live
                           in TransferQueue  -> the SEAL advantage step (observe, GRPO, A-Patch) gets the
                           rows as a `DataProto` plus the agent loop's extras; KL-in-reward and rollout
                           correction are done as verl's own method does them
`_update_actor`            step 9 of `PPOTrainer._step_once`  -> skipped when the advantage step found no
                           learning signal (`no_learning_signal`: every advantage zero, no entropy bonus),
                           as the local engine skips it; logged as `actor/update_skipped`; else run with
                           `use_dynamic_bsz: false` in the batch (the recipe's micro-batch)
`_val_metrics_update`      called by `PPOTrainer._validate` with per-sample `reward_extra_info` lists and
                           the expected counts  -> per-category validation accuracy, a failed session
                           counted as a failure (`validation_records`)
`_save_checkpoint`         `PPOTrainer.fit` (save_freq) writes `global_step_N/`  -> `seal_state.json` beside
                           it (`checkpoint_saved`), then in a background thread the signed manifest, the
                           `step_N` link, `latest.json` and the checkpoint policy (`checkpoint_policy.SaveSigner`)
`_load_checkpoint`         `PPOTrainer.init` (resume_mode auto / resume_path)  -> the folder chosen by our rule
                           (`verl_resume_folder`: auto = newest signed full save), its files checked against its
                           signed manifest (`check_checkpoint`) and handed to verl as `resume_path`, then the
                           controller restored from the same folder (`checkpoint_loaded`)
`_agent_loop_registry`     `verl.experimental.agent_loop.agent_loop`, read by `registered()`  -> verl has no
                           public lookup of registered agent loops
`on_init_end` /            `PPOTrainerSync` syncs the actor's weights into vLLM there (at start or resume, and
`on_step_end` +            after every step's update)  -> the `weights_synced` hook runs right after each sync;
`_pending_sync_metrics`    what it returns joins the step's metrics through verl's slot for weight-sync metrics
`llm_server_manager.`      the trainer's Ray handles of verl's vLLM server replicas  -> `rollout_prompt_logprobs`
`server_handles` +         asks every replica for the prompt log-probs of a token sequence (a forward pass,
`generate(prompt_logprobs)` `max_tokens` 1; verl's own teacher-distillation request), i.e. from the weights that
`server_addresses`         serve the rollouts; `rollout_server_addresses`: each replica's HTTP endpoint
`tokenizer` (attribute)    `PPOTrainer._setup` loads it from `actor_rollout_ref.model` before the first step
                           -> `SealTrainer.keep_transcripts` decodes with it: one tokenizer per run

The CPU path (`trainer.device: cpu`) patches more of verl and vLLM: its own module and table,
`seal/engines/verl/cpu_patches.py`.

The post-import hook that registers our agent loop and trainer mode in every verl process is not
here: it must run inside `verl/__init__` without importing verl's packages, so it lives in the cheap
`seal/engines/verl/plugin.py` (it touches no verl name, only Python's import system).

The version gate (verl 0.9.1, refused otherwise at import) is `seal/engines/verl/versions.py`;
`SEAL_ALLOW_VERL_VERSION=1` lets another verl version import this module (with a warning), for trying
an upgrade; every row above is then unverified.
"""

from __future__ import annotations

import logging
import time
from abc import abstractmethod
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from seal.engines.verl.versions import check_installed_verl

PROBE_TIMEOUT_S = 600.0  # the weight probe's bound: a hang guard (it took 16-30 s a sync on 2 CPU cores)

log = logging.getLogger(__name__)

check_installed_verl()  # the rows above are verl 0.9.1's (seal/engines/verl/versions.py)

# Imported after the check: on another version these may fail in less readable ways.
import transfer_queue as tq  # noqa: E402
from tensordict import TensorDict  # noqa: E402
from verl.protocol import DataProto  # noqa: E402
from verl.trainer.ppo.ray_trainer import apply_kl_penalty  # noqa: E402
from verl.trainer.ppo.rollout_corr_helper import compute_rollout_correction_and_add_to_batch  # noqa: E402
from verl.trainer.ppo.v1.trainer_sync import PPOTrainerSync  # noqa: E402
from verl.utils import tensordict_utils as tu  # noqa: E402
from verl.workers.utils.padding import response_to_nested  # noqa: E402

from seal.core.record import EpisodeRecord, object_array  # noqa: E402
from seal.engines.batching import no_learning_signal, skipped_update_metrics  # noqa: E402
from seal.engines.checkpoint_policy import KEEP_KNOB, SaveSigner, verl_resume_folder  # noqa: E402
from seal.engines.checkpoint_trust import TRUST_KNOB  # noqa: E402
from seal.engines.verl.agent_loop import FEED_KEY, validation_records  # noqa: E402
from seal.logging_utils import append_metrics, metrics_row, trim_metrics  # noqa: E402
from seal.run_dir import Checkpoints, transcript_failures_logged, transcript_sample  # noqa: E402

# TransferQueue fields `_compute_advantage` reads (verl's own list for its advantage step).
ADVANTAGE_INPUTS = ["uid", "response_mask", "rm_scores", "rollout_log_probs", "old_log_probs", "ref_log_prob",
                    "values"]


# --------------------------------------------------------------------------- registries
def registered() -> dict[str, bool]:
    """Whether our agent loop and trainer mode are in verl's registries (imports verl's packages)."""
    from verl.experimental.agent_loop.agent_loop import _agent_loop_registry
    from verl.trainer.ppo.v1.trainer_base import TRAINER_REGISTRY

    from seal.engines.verl.config import AGENT_LOOP_NAME, TRAINER_MODE

    return {"agent_loop": AGENT_LOOP_NAME in _agent_loop_registry, "trainer_mode": TRAINER_MODE in TRAINER_REGISTRY}


# --------------------------------------------------------------------------- wrappers of verl's objects
class FeedingManager:
    """Wraps verl's agent-loop manager: stamps every submitted batch with its episode feed.

    All of verl's submissions (training batches, refills, validation) go through
    `generate_sequences(batch)`; verl marks validation batches with a `validate` entry.
    `trainer.episode_feed(validate)` returns an object with `to_json()`.
    """

    def __init__(self, manager: Any, trainer: Any):
        self._manager = manager
        self._trainer = trainer

    def generate_sequences(self, batch: TensorDict) -> Any:
        validate = bool(batch["validate"]) if "validate" in batch else False
        tu.assign_non_tensor_data(batch, FEED_KEY, self._trainer.episode_feed(validate).to_json())
        return self._manager.generate_sequences(batch)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._manager, name)


class MetricsLog:
    """verl's `Tracking` plus `<run_dir>/metrics.jsonl` (one flat `{"step": N, key: value}` per call)."""

    def __init__(self, tracking: Any, jsonl_path: Path | None):
        self.tracking = tracking
        self.jsonl_path = jsonl_path
        if jsonl_path is not None:
            jsonl_path.parent.mkdir(parents=True, exist_ok=True)

    def log(self, data: Mapping[str, Any], step: int, backend: Any = None) -> None:
        if self.tracking is not None:
            self.tracking.log(data=data, step=step, backend=backend)
        if self.jsonl_path is not None:
            append_metrics(self.jsonl_path, metrics_row(data, step))

    def finish(self, exit_code: int = 0) -> None:
        if self.tracking is not None:
            self.tracking.finish(exit_code=exit_code)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.tracking, name)


# --------------------------------------------------------------------------- TransferQueue columns
def as_list(values: Any) -> list[Any]:
    """A non-tensor column from TransferQueue as a list: depending on the backend it arrives as a
    NonTensorStack, a numpy array or tensordict's LinkedList (a list subclass without `tolist`)."""
    return list(values) if isinstance(values, list) or not hasattr(values, "tolist") else values.tolist()


# --------------------------------------------------------------------------- the trainer
class TrainerAdapter(PPOTrainerSync):
    """verl's synchronous v1 trainer, opened at the points SEAL needs (the module table).

    A subclass implements the hooks below, none of which sees a verl-private object:
    `episode_feed`, `metrics_jsonl_path`, `advantage_step`, `validation_metrics`,
    `checkpoint_saved`, `checkpoint_loaded`. `save_checkpoint()` saves through verl.
    """

    # ------------------------------------------------------------------ hooks for the subclass
    @abstractmethod
    def episode_feed(self, validate: bool) -> Any:
        """How the episodes of a batch being submitted run (an object with `to_json()`)."""

    @abstractmethod
    def metrics_jsonl_path(self) -> Path | None:
        """Where every logged dict is appended as one line (None: nowhere)."""

    @abstractmethod
    def advantage_step(self, data: DataProto, records: list[EpisodeRecord | None], batch_keys: list[str],
                       metrics: dict) -> None:
        """Set `data.batch["advantages"]` / `["returns"]` from the rows' rewards.

        `data.batch` holds `token_level_rewards`, `response_mask` ([B, R], padded) and whatever verl
        computed; `data.non_tensor_batch["uid"]` the GRPO groups. `records[i]` is row i's episode record,
        read from its agent-loop `extra_fields` (None for verl's padding rows); `batch_keys` the rows'
        TransferQueue keys.
        """

    @abstractmethod
    def validation_metrics(self, records: list[EpisodeRecord], infos: Mapping[str, Sequence[Any]]) -> dict[str, float]:
        """Metrics added to verl's validation metrics (one record per validation episode; `infos`: verl's
        per-sample `reward_extra_info` lists, aligned with the first `len(data_sources)` records)."""

    @abstractmethod
    def checkpoint_saved(self, step: int, checkpoints: Checkpoints) -> None:
        """verl has written `checkpoints.verl_step_dir(step)`."""

    @abstractmethod
    def keep_transcripts(self, records: list[EpisodeRecord], tokens: list[tuple[list[int], list[int]]]) -> None:
        """A sample of the step's training episodes: their records and (prompt, response) token ids."""

    @abstractmethod
    def checkpoint_loaded(self, step: int, folder: Path) -> None:
        """verl has resumed from `folder` (a `global_step_N` folder) at `step` > 0."""

    def weights_synced(self) -> dict[str, float]:
        """verl has just synced the actor's weights into the rollout servers (at start or resume, and after every
        step's update); returns metrics for the step (those of the start are logged with the first step).
        Default: none."""
        return {}

    def rollout_prompt_logprobs(self, token_ids: Sequence[int]) -> list[list[float]]:
        """Log-probs of `token_ids[1:]`, each given the tokens before it, computed by every vLLM server replica that
        serves the rollouts (one list per replica, in the manager's order), with the weights each holds now (raw
        log-probs: no temperature). The replicas are asked at once and answer in parallel."""
        import uuid

        import ray

        ids = [int(t) for t in token_ids]
        params = {"max_tokens": 1, "temperature": 1.0, "prompt_logprobs": 0, "detokenize": False}
        handles = self.llm_server_manager.server_handles
        try:
            outs = ray.get([handle.generate.remote(ids, params, f"seal-probe-{uuid.uuid4().hex}")
                            for handle in handles], timeout=PROBE_TIMEOUT_S)
        except ray.exceptions.GetTimeoutError as exc:
            raise TimeoutError(f"the weight probe: {len(handles)} vLLM replica(s) did not answer a {len(ids)}-token "
                               f"prompt-log-prob request within {PROBE_TIMEOUT_S:.0f} s") from exc
        # row i: token i + 1 (verl pads one dummy row at the end)
        return [[float(row[0]) for row in out.extra_fields["prompt_logprobs"][: len(ids) - 1]] for out in outs]

    def rollout_server_addresses(self) -> list[str]:
        """`host:port` of each vLLM server replica's HTTP endpoint, in the manager's order."""
        return list(self.llm_server_manager.server_addresses)

    def save_checkpoint(self) -> None:
        """Save the current step through verl (then `checkpoint_saved` runs)."""
        self._save_checkpoint()

    @property
    def checkpoints(self) -> Checkpoints:
        return Checkpoints(str(self.config.trainer.default_local_dir))

    # ------------------------------------------------------------------ property tricks
    @property
    def trainer_mode(self) -> str:
        return "sync"

    @trainer_mode.setter
    def trainer_mode(self, value: str) -> None:
        self.registered_mode = value

    @property
    def logger(self) -> Any:
        return self.__dict__.get("_metrics_log")

    @logger.setter
    def logger(self, tracking: Any) -> None:
        path = self.metrics_jsonl_path()
        if path is not None:
            # verl creates the logger after loading a checkpoint: a fresh run starts a new file, a resumed
            # one drops what the interrupted run logged after its checkpoint (as the local engine does).
            # The run directory may not exist yet (verl called directly, not through the launcher).
            path.parent.mkdir(parents=True, exist_ok=True)
            trim_metrics(path, keep_through=int(getattr(self, "global_steps", 0) or 0) or None)
        self.__dict__["_metrics_log"] = MetricsLog(tracking, path)

    # ------------------------------------------------------------------ overrides
    def on_init_end(self) -> None:
        super().on_init_end()  # verl's first weight sync (also after loading a checkpoint)
        self._add_sync_metrics(self.weights_synced())  # logged with the first step

    def on_step_end(self) -> None:
        super().on_step_end()  # verl's weight sync of the step's update
        start = time.perf_counter()
        synced = self.weights_synced()
        if synced:
            self.timing_raw["weight_probe"] = time.perf_counter() - start
        self._add_sync_metrics(synced)

    def _add_sync_metrics(self, metrics: Mapping[str, float]) -> None:
        if metrics:
            self._pending_sync_metrics = {**(self.__dict__.get("_pending_sync_metrics") or {}), **metrics}

    def fit(self, agent_loop_manager: Any) -> None:
        try:
            super().fit(FeedingManager(agent_loop_manager, self))
        except BaseException:
            self.saves.join(quiet=True)  # the last save signed if it can be; the run's own error is raised
            raise
        self.saves.settle()

    def _compute_advantage(self, batch: Any, metrics: dict) -> Any:
        keys, partition = list(batch.keys), batch.partition_id
        padding = [bool(tag.get("is_padding", False)) for tag in batch.tags]
        td = tq.kv_batch_get(keys=keys, partition_id=partition, select_fields=ADVANTAGE_INPUTS)
        raw_extras = tq.kv_batch_get(keys=keys, partition_id=partition, select_fields=["extra_fields"])
        records = [None if pad else EpisodeRecord.from_dict(ex) for ex, pad in
                   zip(as_list(raw_extras["extra_fields"]), padding, strict=True)]

        nested_mask = td["response_mask"]
        data = DataProto(batch=td.to_padded_tensor())
        data.batch["token_level_scores"] = data.batch["rm_scores"]
        data.non_tensor_batch["uid"] = object_array(as_list(data.batch.pop("uid")))
        algorithm = self.config.algorithm
        if algorithm.use_kl_in_reward:
            data, kl_metrics = apply_kl_penalty(data, kl_ctrl=self.kl_ctrl_in_reward,
                                                kl_penalty=algorithm.kl_penalty)
            metrics.update(kl_metrics)
        else:
            data.batch["token_level_rewards"] = data.batch["token_level_scores"]
        corr = algorithm.get("rollout_correction", None)
        bypass = bool(corr and corr.get("bypass_mode", False))
        correct = corr is not None and "rollout_log_probs" in data.batch and not bypass
        if correct:
            data, corr_metrics = compute_rollout_correction_and_add_to_batch(data, corr)
            metrics.update(corr_metrics)

        self.advantage_step(data, records, keys, metrics)
        self.__dict__["_no_learning_signal"] = no_learning_signal(
            data.batch["advantages"], data.batch["response_mask"],
            float(self.config.actor_rollout_ref.actor.entropy_coeff))
        self._keep_transcripts(keys, partition, records)

        out_fields = ["advantages", "returns"]
        if algorithm.use_kl_in_reward:
            out_fields.append("token_level_rewards")
        if correct:
            out_fields.append("response_mask")
            if "rollout_is_weights" in data.batch:
                out_fields.append("rollout_is_weights")
        output = TensorDict({f: response_to_nested(data.batch[f], nested_mask) for f in out_fields},
                            batch_size=len(keys))
        return tq.kv_batch_put(keys=keys, partition_id=partition, fields=output)

    def _keep_transcripts(self, keys: list[str], partition: str, records: list[EpisodeRecord | None]) -> None:
        """The step's transcript sample (`seal.run_dir.transcript_sample`): the kept rows' token ids from
        TransferQueue, handed to `keep_transcripts`. A failure anywhere here is logged and the step goes on
        (`seal.run_dir.transcript_failures_logged`, the rule both engines follow)."""
        with transcript_failures_logged(getattr(self, "global_steps", "?")):
            rows = transcript_sample([r.task_id if r is not None else None for r in records])
            if not rows:
                return
            td = tq.kv_batch_get(keys=[keys[i] for i in rows], partition_id=partition,
                                 select_fields=["prompts", "responses"])
            tokens = [(td["prompts"][j].tolist(), td["responses"][j].tolist()) for j in range(len(rows))]
            self.keep_transcripts([records[i] for i in rows], tokens)

    def _update_actor(self, batch: Any, metrics: dict) -> Any:
        if not self.__dict__.pop("_no_learning_signal", False):
            metrics["actor/update_skipped"] = 0.0
            # verl's actor engine has one dynamic-batch switch for its forward-only pass and its update; a key
            # the batch carries wins over the engine's: the update keeps the recipe's micro-batch (gpu_settings).
            batch.extra_info["use_dynamic_bsz"] = False
            return super()._update_actor(batch, metrics)
        # The policy-gradient term is exactly zero: no forward/backward/optimizer step (the local engine's
        # rule, `seal.engines.batching.no_learning_signal`). The weights are unchanged, so the weight sync
        # verl runs next hands vLLM the same weights.
        log.info("step %s: every advantage is zero (no task group has a reward spread): actor update skipped",
                 getattr(self, "global_steps", "?"))
        metrics.update(skipped_update_metrics())
        return batch

    def _val_metrics_update(self, data_sources, sample_uids, reward_extra_infos_dict, sample_turns,
                            expected_acc_counts=None) -> dict[str, float]:
        metrics = super()._val_metrics_update(data_sources, sample_uids, reward_extra_infos_dict, sample_turns,
                                              expected_acc_counts=expected_acc_counts)
        records = validation_records(data_sources, sample_uids, reward_extra_infos_dict, expected_acc_counts)
        metrics.update(self.validation_metrics(records, reward_extra_infos_dict))
        return metrics

    def _save_checkpoint(self) -> None:
        self.saves.join()  # the previous save signed (and published) before verl writes the next
        super()._save_checkpoint()
        self.checkpoint_saved(int(self.global_steps), self.checkpoints)
        self.saves.saved(int(self.global_steps))  # signed last, over every file of the step (ours included)

    def _load_checkpoint(self) -> None:
        cfg = self.config.trainer
        requested = str(cfg.resume_from_path) if cfg.resume_mode == "resume_path" else str(cfg.resume_mode)
        trust = bool(self._recipe_trainer(TRUST_KNOB, False))
        folder = verl_resume_folder(self.checkpoints, requested, trust, verify=True)  # hashed before verl reads it
        saved = cfg.resume_mode, cfg.resume_from_path
        # verl loads exactly the folder checked: ours, as its resume_path (both keys exist in verl's config)
        cfg.resume_mode, cfg.resume_from_path = ("resume_path", str(folder)) if folder else ("disable", None)
        try:
            super()._load_checkpoint()
        finally:
            cfg.resume_mode, cfg.resume_from_path = saved
        if self.global_steps > 0 and folder is not None:
            self.checkpoint_loaded(int(self.global_steps), folder)
        self.saves.check_references("after the resume")  # with SEAL_CHECK_RUN_REFERENCES=1

    @property
    def saves(self) -> SaveSigner:
        """The signer of this run's saves (`seal.engines.checkpoint_policy`), made on first use."""
        if "_saves" not in self.__dict__:
            self.__dict__["_saves"] = SaveSigner(self.checkpoints, int(self._recipe_trainer(KEEP_KNOB, 2)))
        return self.__dict__["_saves"]

    def _recipe_trainer(self, knob: str, default: Any) -> Any:
        """A `trainer.*` knob of the recipe the config carries (`seal.recipe`)."""
        return self.config.get("seal", {}).get("recipe", {}).get("trainer", {}).get(knob.split(".")[1], default)

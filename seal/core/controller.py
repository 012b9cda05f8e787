"""`SealController`: the one place where the SEAL method runs, once per training step, in both engines.

One training step, in order (docs/seal_core.md; both engines, `seal.engines.local` and `seal.engines.verl`, do this)::

    controller = SealController(recipe.seal)        # once per run: the recipe's seal.* block (SealConfig)
    omega    = controller.interface("train")        # Ω_t sent with this step's training episodes
    rollouts = <run the episodes; reward = controller.reward_fn(evaluate reply)>
    records  = [r.record() for r in rollouts]       # seal.core.record.EpisodeRecord: all the core reads
    m  = controller.observe(records, step)          # C_t: capability state over non-excluded episodes
    data = <DataProto + GRPO advantages>
    m |= controller.reweight(data, step)            # dynamic weights (once per step) + A-Patch
    <actor update>
    m |= controller.evolve(step)                    # Ω_{t+1} = evolve(Ω_t, C_t)  (or Ω_0 kept)
    at epoch end: controller.end_epoch()            # new capability window
    data.sampler failure_profile: controller.repair  # the curriculum's repair statistics (seal.core.curriculum)
    validation:   controller.validation_metrics(val_records)
    checkpoint:   controller.save(ckpt_dir)  ->  ckpt_dir/seal_state.json

Validation episodes never get an interface (`interface("val")` is None; the service refuses one).
"""

from __future__ import annotations

import copy
import json
import os
import uuid
from collections import Counter, defaultdict
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from env_service.vocab import CATEGORIES
from seal.core.adaptive import RepairStats, adaptive_rho, apply_task_weights, repair_metrics
from seal.core.apatch import apply_apatch
from seal.core.capability import CapabilityState
from seal.core.config import SealConfig
from seal.core.evolve import evolve, initial_interface, interface_metrics, validate_interface
from seal.core.record import EpisodeRecord, check_records
from seal.core.reward import compute_reward
from seal.io_utils import write_json_atomic

if TYPE_CHECKING:
    from verl import DataProto

STATE_FILE = "seal_state.json"
STATE_FORMAT = 1


def initial_training_interface(config: SealConfig) -> dict[str, Any] | None:
    """Ω_0, the interface of the first training episodes; None when the recipe has no interface."""
    return initial_interface(config.evolve_config) if config.interface.enable else None


class SealController:
    """SEAL's per-step logic over the `seal.*` block of a recipe (`recipe.seal`, a `SealConfig`).

    Args:
        config: the run's SEAL settings (vocabulary, reward, A-Patch, dynamic weights, interface).
        run_id: identity of the run; `load` refuses the state of another run unless forced. None =
            a fresh id, replaced by the checkpoint's id when a checkpoint is loaded into a controller
            that has not trained yet (resume).
    """

    def __init__(self, config: SealConfig, run_id: str | None = None) -> None:
        if not isinstance(config, SealConfig):
            raise TypeError(f"SealController needs a seal.core.config.SealConfig (a recipe's `seal` block), "
                            f"got {type(config).__name__}")
        self.config = config
        self.vocabulary = config.vocabulary
        self.apatch_cfg = config.apatch_config
        self.dynamic_cfg = config.capability
        self.evolve_cfg = config.evolve_config
        self.reward_cfg = config.reward
        self.interface_enabled = config.interface.enable
        self.closed_loop = config.interface.closed_loop
        self._fresh_id = run_id is None
        self.run_id = run_id if run_id is not None else uuid.uuid4().hex
        self.state = CapabilityState(self.vocabulary, base_weights=self.apatch_cfg.static_weights(),
                                     config=self.dynamic_cfg, run_id=self.run_id)
        self.omega: dict[str, Any] = initial_interface(self.evolve_cfg)  # kept (and logged) also with no interface
        self.training_progress = 0.0  # fraction of training done, for reward modes with a decaying cap
        self.weights_step: int | None = None  # step whose dynamic-weight update already ran
        self.last_step: int | None = None
        # Beyond the paper (seal.core.adaptive): repairability is tracked in every run (it changes nothing by
        # itself) so that adaptive rho and the failure-profile curriculum read one set of statistics.
        self.adaptive_cfg = config.adaptive
        self.repair = RepairStats(self.vocabulary, self.adaptive_cfg.repair_prior, self.adaptive_cfg.repair_decay)

    # ------------------------------------------------------------------ episodes
    def interface(self, mode: str = "train") -> dict[str, Any] | None:
        """Ω_t for a training episode; None (raw interface) for validation or when the recipe has none."""
        if mode not in ("train", "val", "eval"):
            raise ValueError(f"mode must be 'train' or 'val', got {mode!r}")
        if mode != "train" or not self.interface_enabled:
            return None
        return copy.deepcopy(self.omega)  # a copy the caller may keep

    def set_training_progress(self, step: int, total_steps: int, steps_per_epoch: int | None = None) -> None:
        """Record how far training is (reward `cap_decay`); call before the step's rollouts. `step` is
        0-based. With `seal.reward.decay_clock: epoch` (the release) it is the epoch index over the number of
        epochs, which needs `steps_per_epoch`; otherwise `step / total_steps`."""
        if self.reward_cfg.decay_clock == "epoch" and steps_per_epoch:
            epochs = -(-max(total_steps, 1) // steps_per_epoch)
            progress = (step // steps_per_epoch) / epochs
        else:
            progress = step / max(total_steps, 1)
        self.training_progress = min(max(progress, 0.0), 1.0)

    def reward_fn(self, eval_result: Mapping[str, Any]) -> float:
        """Training reward of one episode from its `evaluate` reply (`seal.reward`, paper: the 0/1 verdict)."""
        return compute_reward(eval_result, self.reward_cfg, self.training_progress)

    # ------------------------------------------------------------------ one step
    def observe(self, records: Sequence[EpisodeRecord], step: int) -> dict[str, float]:
        """Feed the step's non-excluded training episodes into the capability state.

        Returns `train/reward_mean`, `train/accuracy_mean`, `train/excluded`, `train/num_rollouts`
        and `train/tag_frac/<tag>` (share of the step's turn tags, configured vocabulary).
        """
        check_records(records, "SealController.observe")
        kept = [r for r in records if not r.excluded]
        self.state.observe(kept, step=step)
        self.repair.observe(kept, step)
        self.last_step = step
        n = len(kept)
        metrics = {
            "train/num_rollouts": float(len(records)),
            "train/excluded": float(len(records) - n),
            "train/reward_mean": sum(r.reward for r in kept) / n if n else 0.0,
            "train/accuracy_mean": sum(1.0 for r in kept if r.success) / n if n else 0.0,
        }
        tag_counts = Counter(tag for r in kept for tag in r.tags(self.vocabulary))
        total = sum(tag_counts.values())
        for tag, count in sorted(tag_counts.items()):
            metrics[f"train/tag_frac/{tag}"] = count / total
        return metrics

    def update_weights(self, step: int) -> dict[str, float]:
        """The dynamic A-Patch weights for `step`: one EMA update per step, after `observe`."""
        if self.weights_step != step:
            if self.adaptive_cfg.rho == "adaptive":
                self.state.set_base_weights(self.adaptive_rho())
            self.state.update_dynamic_weights()
            self.weights_step = step
        return self.state.dynamic_weights

    def reweight(self, data: DataProto, step: int) -> dict[str, float]:
        """A-Patch on `data.batch["advantages"]` (in place), after GRPO and before the actor update.

        With `seal.capability.enable` the weights are the capability state's dynamic weights (updated
        once per step); otherwise the static table. A disabled A-Patch leaves the advantages alone and
        does not move the weights (release: the update lives inside A-Patch).
        """
        metrics: dict[str, float] = {}
        if self.adaptive_cfg.task_weights != "off":  # the per-task baseline, with or without A-Patch
            metrics |= apply_task_weights(data, self.state.bucket("tasks", window=False), self.adaptive_cfg)
        if not self.apatch_cfg.enable:
            return metrics | {"apatch/enabled": 0.0}
        weights = self.update_weights(step)
        metrics |= apply_apatch(data, weights, self.apatch_cfg, step)
        metrics["apatch/dynamic_enabled"] = float(self.dynamic_cfg.enable)
        return metrics

    def adaptive_rho(self) -> dict[str, float]:
        """ρ_t from the static table and the run's repair statistics (seal.core.adaptive)."""
        return adaptive_rho(self.apatch_cfg.static_weights(), self.repair, self.adaptive_cfg.rho_rate,
                            self.apatch_cfg.min_scale, self.apatch_cfg.max_scale)

    def evolve(self, step: int) -> dict[str, float]:
        """Ω_{t+1} from Ω_t and C_t (closed loop), or Ω_0 kept; returns `interface/*` + `capability/*`."""
        if self.interface_enabled and self.closed_loop:
            self.omega = evolve(self.omega, self.state.profile("window"), self.evolve_cfg)
        metrics = {"interface/enabled": float(self.interface_enabled),
                   "interface/closed_loop": float(self.interface_enabled and self.closed_loop)}
        if self.interface_enabled:
            metrics |= interface_metrics(self.omega)
        metrics |= self.state.metrics()
        metrics |= repair_metrics(self.repair, self.adaptive_rho() if self.adaptive_cfg.rho == "adaptive" else None)
        return metrics

    def end_epoch(self) -> None:
        """A new capability window (release: windows reset at epoch end)."""
        self.state.reset_window()

    # ------------------------------------------------------------------ validation
    @staticmethod
    def validation_metrics(records: Sequence[EpisodeRecord]) -> dict[str, float]:
        """`val/accuracy/<category>`, `val/count/<category>`, `val/accuracy/average` (mean of the
        category means, as the paper's Average column), `val/excluded`.

        An excluded validation episode counts as a failure (accuracy 0) so each category keeps its
        full denominator; `val/excluded` says how many there were.
        """
        sums: dict[str, float] = defaultdict(float)
        counts: dict[str, int] = defaultdict(int)
        excluded = 0
        check_records(records, "SealController.validation_metrics")
        for r in records:
            counts[r.category] += 1
            if r.excluded:
                excluded += 1
                continue
            sums[r.category] += r.accuracy if r.accuracy is not None else 0.0
        metrics: dict[str, float] = {}
        order = [c for c in CATEGORIES if c in counts] + sorted(c for c in counts if c not in CATEGORIES)
        for cat in order:
            metrics[f"val/accuracy/{cat}"] = sums[cat] / counts[cat]
            metrics[f"val/count/{cat}"] = float(counts[cat])
        means = [metrics[f"val/accuracy/{c}"] for c in order]
        metrics["val/accuracy/average"] = sum(means) / len(means) if means else 0.0
        metrics["val/excluded"] = float(excluded)
        return metrics

    # ------------------------------------------------------------------ persistence
    def state_dict(self) -> dict[str, Any]:
        return {
            "format": STATE_FORMAT,
            "run_id": self.run_id,
            "vocabulary": self.vocabulary,
            "omega": json.loads(json.dumps(self.omega)),
            "training_progress": self.training_progress,
            "weights_step": self.weights_step,
            "last_step": self.last_step,
            "capability": self.state.state_dict(),
            "repair": self.repair.state_dict(),
        }

    def load_state_dict(self, state: Mapping[str, Any], force: bool = False) -> None:
        """Restore from `state_dict()`. A controller that was built without a run id and has not
        observed anything adopts the checkpoint's id (resume); otherwise the ids must match unless
        `force`. Another vocabulary always raises."""
        if state.get("format") != STATE_FORMAT:
            raise ValueError(f"seal state format {state.get('format')!r}, expected {STATE_FORMAT}")
        if state.get("vocabulary") != self.vocabulary:
            raise ValueError(f"seal state is for vocabulary {state.get('vocabulary')!r}, "
                             f"this run uses {self.vocabulary!r}")
        stored = state.get("run_id")
        if self._fresh_id and self.state.observe_count == 0 and stored:
            self.run_id = stored
            self.state.run_id = stored
        self.state.load_state_dict(state["capability"], force=force)
        if "repair" in state:  # a checkpoint written before repair statistics existed starts them afresh
            self.repair.load_state_dict(state["repair"])
        self.omega = validate_interface(dict(state["omega"]))  # the complete form, every key present
        self.training_progress = float(state.get("training_progress", 0.0))
        self.weights_step = state.get("weights_step")
        self.last_step = state.get("last_step")
        self._fresh_id = False

    def save(self, directory: str | os.PathLike[str]) -> Path:
        """Write `<directory>/seal_state.json` atomically."""
        return write_json_atomic(Path(directory) / STATE_FILE, self.state_dict())

    def load(self, directory: str | os.PathLike[str], force: bool = False) -> None:
        """Restore from `<directory>/seal_state.json` (a checkpoint directory)."""
        path = Path(directory) / STATE_FILE
        if not path.is_file():
            raise FileNotFoundError(f"no {STATE_FILE} in {directory}")
        try:
            with open(path, encoding="utf-8") as fh:
                state = json.load(fh)
            self.load_state_dict(state, force=force)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{path}: damaged seal state ({exc})") from None
        except (KeyError, TypeError, AttributeError) as exc:
            raise ValueError(f"{path}: damaged seal state (missing or mistyped {exc})") from None
        except ValueError as exc:  # every refusal names the file (RunMismatchError keeps its type)
            exc.args = (f"{path}: {exc}", *exc.args[1:])
            raise

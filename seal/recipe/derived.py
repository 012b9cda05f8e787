"""Values the engines derive from a `Recipe`: rollout limits, sampling, step counts, paths, service flags."""

from __future__ import annotations

from pathlib import Path

from seal.recipe.schema import ConfigError, Recipe
from seal.rollout.types import RolloutLimits, SamplingParams
from seal.run_dir import RunDir


def rollout_limits(cfg: Recipe) -> RolloutLimits:
    return RolloutLimits(
        max_prompt_length=cfg.data.max_prompt_length,
        max_response_length=cfg.data.max_response_length,
        max_model_len=cfg.rollout.max_model_len,
        max_tokens_per_call=cfg.rollout.max_tokens_per_call,
        max_model_calls=cfg.rollout.max_model_calls,
        max_observation_tokens=cfg.rollout.max_observation_tokens,
    )


def sampling_params(cfg: Recipe, mode: str = "train", seed: int | None = None) -> SamplingParams:
    """Training sampling (temperature/top_p/top_k) or validation decoding (greedy by default)."""
    if mode == "train":
        return SamplingParams(temperature=cfg.rollout.temperature, top_p=cfg.rollout.top_p,
                              top_k=cfg.rollout.top_k, seed=seed)
    if mode in ("val", "eval"):
        # Release validation: temperature 0, top_p 1.0, top_k -1 (docs/evaluation.md).
        return SamplingParams(temperature=cfg.rollout.val_temperature, top_p=1.0, top_k=-1, seed=seed)
    raise ValueError(f"mode must be 'train' or 'val', got {mode!r}")


VALIDATE_AT_END_ONLY = 0  # trainer.test_freq: validate at the last step only
VALIDATE_NEVER = -1  # trainer.test_freq: no validation during or after training (val_before_train apart)


def validates_at(test_freq: int, step: int, last: bool) -> bool:
    """Whether a run validates after training step `step` (`last`: the run's final step): every `test_freq` steps
    and at the last one; `VALIDATE_AT_END_ONLY` (0) the last one only; `VALIDATE_NEVER` (-1) none. Both engines
    follow this rule (the verl engine through `seal.engines.verl.config.verl_test_freq`)."""
    if test_freq < VALIDATE_NEVER:
        raise ValueError(f"trainer.test_freq must be >= {VALIDATE_NEVER}, got {test_freq}")
    if test_freq == VALIDATE_NEVER:
        return False
    return last or (test_freq > 0 and step % test_freq == 0)


def steps_per_epoch(cfg: Recipe, num_train_tasks: int) -> int:
    """Full batches per epoch (the release's loader drops the last partial batch: 400 / 32 = 12)."""
    steps = num_train_tasks // cfg.data.train_batch_size
    if steps < 1:
        raise ConfigError(f"{num_train_tasks} training tasks are fewer than data.train_batch_size "
                          f"= {cfg.data.train_batch_size}")
    return steps


def total_training_steps(cfg: Recipe, num_train_tasks: int) -> int:
    """`trainer.total_training_steps` when set, else epochs x steps per epoch (paper: 6 x 12 = 72)."""
    if cfg.trainer.total_training_steps is not None:
        return cfg.trainer.total_training_steps
    return cfg.trainer.total_epochs * steps_per_epoch(cfg, num_train_tasks)


def run_dir(cfg: Recipe, root: str | Path | None = None) -> Path:
    """`<run_root>/<experiment_name>`; a relative `run_root` is taken from `root` (default: the cwd).

    The layout inside it is `seal.run_dir`'s."""
    return RunDir.of(cfg.run_root, cfg.experiment_name, root).root


def env_service_args(cfg: Recipe) -> list[str]:
    """`python -m env_service` flags carrying the recipe's environment settings."""
    step_limit = cfg.env.step_limit
    args = ["--step-limit-scope", step_limit.scope, "--max-steps", str(step_limit.max_steps)]
    if not cfg.env.strict_availability:
        args.append("--no-strict-availability")
    if cfg.env.release_reveal_note:
        args.append("--release-reveal-note")
    if cfg.env.val_rules != "release":
        args += ["--eval-rules", cfg.env.val_rules]
    if cfg.data.allow_eval_overlap:  # the run trains on eval-split tasks on purpose: its service must allow it
        args.append("--allow-train-on-eval")
    return args

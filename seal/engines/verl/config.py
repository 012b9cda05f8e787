"""Recipe (`docs/config.md`) -> verl 0.9.1 trainer config.

`to_verl_config(cfg, run_dir)` starts from verl's own default `ppo_trainer` config, composed from the
installed package (so every key verl expects is there with verl's default), and overrides the keys our
recipe owns. Everything else keeps verl's default. Sources of the values we set ourselves (not from the
recipe) are marked R (release recipe) or O (ours).

Where our recipe knobs land in verl (the full table is in docs/verl_engine.md)::

    model.path / dtype                -> actor_rollout_ref.model.path, *.fsdp_config.dtype, rollout.dtype
    data.*                            -> data.* (train/val files made absolute)
    rollout.n / temperature / top_*   -> actor_rollout_ref.rollout.*
    rollout.val_temperature / val_n   -> actor_rollout_ref.rollout.val_kwargs.*  (greedy validation)
    rollout.max_model_len, gpu_memory_utilization, tensor_parallel_size -> rollout.* (vLLM)
    actor.*                           -> actor_rollout_ref.actor.* (+ optim.lr/weight_decay/clip_grad)
    algorithm.*                       -> algorithm.*
    trainer.*                         -> trainer.* (checkpoints under <run_dir>/checkpoints)

The resolved recipe itself travels inside the verl config under `seal.recipe` (with `seal.run_dir`):
verl hands its whole config to the trainer and to every agent-loop worker, so our trainer mode and agent
loop read their settings from there, in whatever process or node they run.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf, open_dict

from seal import recipe as C
from seal.engines.verl.cpu_settings import CPU_MIXED_PRECISION_KEYS, SLEEP_MODE_KEY, cpu_overrides
from seal.engines.verl.gpu_settings import gpu_overrides
from seal.io_utils import input_path
from seal.run_dir import VERL_STEP_PREFIX, RunDir

AGENT_LOOP_NAME = "seal_bfcl"  # seal.engines.verl.agent_loop.SealBfclAgentLoop
TRAINER_MODE = "seal"  # seal.engines.verl.trainer.SealTrainer
ROLLOUT_ENGINE = "vllm"
# Release: the reference policy's parameters are offloaded to CPU.
REF_PARAM_OFFLOAD = True
# Ours: checkpoints also carry Hugging Face weights (actor/huggingface) so `seal.evaluate` / vLLM can
# serve any checkpoint directly; verl's default saves FSDP shards only.
CHECKPOINT_CONTENTS = ["model", "optimizer", "extra", "hf_model"]
# verl names of the loggers we forward; "jsonl" is written by our trainer (run_dir/metrics.jsonl).
VERL_LOGGERS = {"console": "console", "wandb": "wandb"}
# verl's HFModelConfig reads the attention backend from `override_config`, an empty dict in verl's
# defaults, and falls back to flash_attention_2 (which fails to load without flash-attn): we always set it.
ATTN_KEY = "actor_rollout_ref.model.override_config.attn_implementation"
# Keys our mapping adds although verl's defaults lack them (everything else must exist in verl's defaults).
ADDED_KEYS = frozenset({ATTN_KEY, *CPU_MIXED_PRECISION_KEYS, SLEEP_MODE_KEY, "ray_kwargs.ray_init.num_gpus"})


def resolve_attn_implementation(value: str) -> str:
    """`model.attn_implementation` -> a Hugging Face attention backend: `auto` is flash_attention_2 when the
    `flash_attn` package imports (verl's remove-padding path is built on it), else sdpa (in torch)."""
    if value != "auto":
        return value
    try:
        import flash_attn  # noqa: F401
    except Exception:  # ImportError, or a wheel built against another torch (undefined symbol)
        return "sdpa"
    return "flash_attention_2"


def verl_config_dir() -> Path:
    """`verl/trainer/config` of the installed verl package."""
    import importlib.util

    spec = importlib.util.find_spec("verl")
    if spec is None or not spec.submodule_search_locations:
        raise ImportError("verl is not installed (pip install 'verl[verl-core]==0.9.1')")
    return Path(next(iter(spec.submodule_search_locations))) / "trainer" / "config"


def load_verl_defaults() -> DictConfig:
    """verl's default `ppo_trainer` config, composed with Hydra from the installed package.

    Hydra's global state is saved and restored, so this also works inside a Hydra application.
    """
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    hydra = GlobalHydra.instance()
    saved = hydra.hydra if hydra.is_initialized() else None
    if saved is not None:
        hydra.clear()
    try:
        with initialize_config_dir(config_dir=str(verl_config_dir()), version_base=None):
            cfg = compose(config_name="ppo_trainer", overrides=[f"actor_rollout_ref.rollout.name={ROLLOUT_ENGINE}"])
    finally:
        if saved is not None:
            GlobalHydra.instance().initialize(saved)
    return cfg


def _data_path(path: str) -> str:
    """Absolute path of a data file (the input-path rule, `seal.io_utils.input_path`)."""
    return str(input_path(path))


def resume_settings(resume: str) -> dict[str, Any]:
    """`trainer.resume` (auto | disable | <checkpoint dir>) -> verl's resume_mode / resume_from_path.

    A checkpoint directory may be our `checkpoints/step_N` link or verl's `global_step_N` folder;
    verl needs the latter (it parses the step from the name).
    """
    if resume in ("auto", "disable"):
        return {"trainer.resume_mode": resume, "trainer.resume_from_path": None}
    real = os.path.realpath(os.path.expanduser(resume))
    if VERL_STEP_PREFIX not in os.path.basename(real):
        raise ValueError(f"trainer.resume: {resume!r} is not a verl checkpoint directory "
                         "(checkpoints/step_N or checkpoints/global_step_N)")
    return {"trainer.resume_mode": "resume_path", "trainer.resume_from_path": real}


def _none_is_null(value: str) -> str | None:
    return None if value == "none" else value


def recipe_overrides(cfg: C.Recipe, run_dir: Path) -> dict[str, Any]:
    """The verl keys our recipe sets, as {dotted verl key: value}: one table per part of verl's config."""
    micro = cfg.actor.ppo_micro_batch_size_per_gpu
    out: dict[str, Any] = {
        **model_overrides(cfg.model),
        **data_overrides(cfg.data, cfg.seed),
        **rollout_overrides(cfg.rollout, cfg.data, cfg.model.dtype, micro),
        **actor_overrides(cfg.actor, cfg.rollout.max_model_len, cfg.seed),
        **algorithm_overrides(cfg.algorithm),
        **trainer_overrides(cfg.trainer, cfg.experiment_name, run_dir),
        **resume_settings(cfg.trainer.resume),
    }
    out.update(cpu_overrides(cfg) if cfg.trainer.device == "cpu" else gpu_overrides(cfg))
    return out


def model_overrides(m: C.ModelConfig) -> dict[str, Any]:
    return {
        "actor_rollout_ref.model.path": m.path,
        ATTN_KEY: resolve_attn_implementation(m.attn_implementation),
        "actor_rollout_ref.actor.fsdp_config.dtype": m.dtype,
        "actor_rollout_ref.ref.fsdp_config.dtype": m.dtype,
        "actor_rollout_ref.ref.fsdp_config.param_offload": REF_PARAM_OFFLOAD,
    }


def data_overrides(d: C.DataConfig, seed: int) -> dict[str, Any]:
    """The parquet rows carry agent_name=seal_bfcl and extra_info.task_id; the env service renders the real
    prompt, so verl's own prompt filtering/truncation is not used."""
    return {
        "data.train_files": _data_path(d.train_files),
        "data.val_files": _data_path(d.val_files),
        "data.train_batch_size": d.train_batch_size,
        "data.max_prompt_length": d.max_prompt_length,
        "data.max_response_length": d.max_response_length,
        "data.shuffle": d.shuffle,
        "data.seed": seed,
        "data.return_raw_chat": True,
        "data.filter_overlong_prompts": False,
        "data.val_batch_size": None,  # release: the 400 validation tasks in one batch
    }


def rollout_overrides(r: C.RolloutConfig, d: C.DataConfig, dtype: str, micro: int) -> dict[str, Any]:
    """vLLM's async server running our agent loop; validation sampling under `val_kwargs`."""
    return {
        "actor_rollout_ref.rollout.name": ROLLOUT_ENGINE,
        "actor_rollout_ref.rollout.mode": "async",
        "actor_rollout_ref.rollout.n": r.n,
        "actor_rollout_ref.rollout.temperature": r.temperature,
        "actor_rollout_ref.rollout.top_p": r.top_p,
        "actor_rollout_ref.rollout.top_k": r.top_k,
        "actor_rollout_ref.rollout.prompt_length": d.max_prompt_length,
        "actor_rollout_ref.rollout.response_length": d.max_response_length,
        "actor_rollout_ref.rollout.max_model_len": r.max_model_len,
        "actor_rollout_ref.rollout.gpu_memory_utilization": r.gpu_memory_utilization,
        "actor_rollout_ref.rollout.tensor_model_parallel_size": r.tensor_parallel_size,
        "actor_rollout_ref.rollout.dtype": dtype,
        "actor_rollout_ref.rollout.calculate_log_probs": True,
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu": micro,
        "actor_rollout_ref.rollout.val_kwargs.temperature": r.val_temperature,
        "actor_rollout_ref.rollout.val_kwargs.top_p": 1.0,
        "actor_rollout_ref.rollout.val_kwargs.top_k": -1,
        "actor_rollout_ref.rollout.val_kwargs.n": r.val_n,
        "actor_rollout_ref.rollout.val_kwargs.do_sample": r.val_temperature > 0,
        "actor_rollout_ref.rollout.agent.default_agent_loop": AGENT_LOOP_NAME,
        "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu": micro,
    }


def actor_overrides(a: C.ActorConfig, max_model_len: int, seed: int) -> dict[str, Any]:
    """Dual-clip PPO loss, KL loss, token-mean."""
    micro = a.ppo_micro_batch_size_per_gpu
    return {
        "actor_rollout_ref.actor.optim.lr": a.lr,
        "actor_rollout_ref.actor.optim.weight_decay": a.weight_decay,
        "actor_rollout_ref.actor.optim.clip_grad": a.grad_clip,  # read by the v1 FSDP engine
        "actor_rollout_ref.actor.grad_clip": a.grad_clip,  # legacy key, kept consistent
        "actor_rollout_ref.actor.clip_ratio": a.clip_ratio_low,
        "actor_rollout_ref.actor.clip_ratio_low": a.clip_ratio_low,
        "actor_rollout_ref.actor.clip_ratio_high": a.clip_ratio_high,
        "actor_rollout_ref.actor.clip_ratio_c": a.clip_ratio_c,
        "actor_rollout_ref.actor.policy_loss.loss_mode": "vanilla",
        "actor_rollout_ref.actor.use_kl_loss": a.use_kl_loss,
        "actor_rollout_ref.actor.kl_loss_coef": a.kl_loss_coef,
        "actor_rollout_ref.actor.kl_loss_type": a.kl_loss_type,
        "actor_rollout_ref.actor.entropy_coeff": a.entropy_coeff,
        "actor_rollout_ref.actor.loss_agg_mode": a.loss_agg_mode,
        "actor_rollout_ref.actor.ppo_mini_batch_size": a.ppo_mini_batch_size,
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu": micro,
        "actor_rollout_ref.actor.ppo_epochs": a.ppo_epochs,
        # R: ppo / log-prob max token length 16384 = the context window.
        "actor_rollout_ref.actor.ppo_max_token_len_per_gpu": max_model_len,
        "actor_rollout_ref.actor.data_loader_seed": seed,
        "actor_rollout_ref.actor.checkpoint.save_contents": list(CHECKPOINT_CONTENTS),
        "actor_rollout_ref.actor.fsdp_config.optimizer_offload": a.offload in ("optimizer", "all"),
        "actor_rollout_ref.actor.fsdp_config.param_offload": a.offload == "all",
    }


def algorithm_overrides(alg: C.AlgorithmConfig) -> dict[str, Any]:
    return {
        "algorithm.adv_estimator": alg.adv_estimator,
        "algorithm.norm_adv_by_std_in_grpo": alg.norm_adv_by_std_in_grpo,
        "algorithm.use_kl_in_reward": alg.use_kl_in_reward,
        # rollout correction (verl's RolloutCorrectionConfig; off = null, verl's default). Decoupled mode: the
        # actor's old log-probs are recomputed, and the weights compare them with vLLM's rollout log-probs.
        "algorithm.rollout_correction.rollout_is": _none_is_null(alg.rollout_correction.rollout_is),
        "algorithm.rollout_correction.rollout_is_threshold": alg.rollout_correction.rollout_is_threshold,
        "algorithm.rollout_correction.rollout_is_batch_normalize": alg.rollout_correction.rollout_is_batch_normalize,
        "algorithm.rollout_correction.rollout_rs": _none_is_null(alg.rollout_correction.rollout_rs),
        "algorithm.rollout_correction.rollout_rs_threshold": alg.rollout_correction.rollout_rs_threshold,
        "algorithm.rollout_correction.bypass_mode": False,
        "algorithm.gamma": 1.0,
        "algorithm.lam": 1.0,
        "critic.enable": False,
        # O: the agent loop sets each episode's reward itself (verl then skips its reward loop), so
        # verl's reward workers stay idle; one is enough.
        "reward.num_workers": 1,
    }


VERL_LAST_STEP_ONLY = 2**31 - 1  # a test_freq no run reaches


def verl_test_freq(test_freq: int) -> int:
    """verl's `trainer.test_freq` for the recipe's (`seal.recipe.validates_at`): verl validates when `test_freq > 0
    and (is_last_step or step % test_freq == 0)`, so the recipe's 0 (the last step only) goes as a frequency no run
    reaches, its -1 (never) as verl's -1."""
    C.validates_at(test_freq, 1, False)  # refuses a value below -1
    return {C.VALIDATE_NEVER: -1, C.VALIDATE_AT_END_ONLY: VERL_LAST_STEP_ONLY}.get(test_freq, int(test_freq))


def trainer_overrides(t: C.TrainerConfig, experiment_name: str, run_dir: Path) -> dict[str, Any]:
    return {
        "trainer.total_epochs": t.total_epochs,
        "trainer.total_training_steps": (None if t.total_training_steps is None else int(t.total_training_steps)),
        "trainer.test_freq": verl_test_freq(t.test_freq),
        "trainer.val_before_train": t.val_before_train,
        # verl saves when save_freq > 0; with 0 our trainer still saves the last step (docs/config.md).
        "trainer.save_freq": t.save_freq if t.save_freq > 0 else -1,
        "trainer.n_gpus_per_node": t.n_gpus_per_node,
        "trainer.nnodes": t.nnodes,
        "trainer.logger": [VERL_LOGGERS[name] for name in t.logger if name in VERL_LOGGERS],
        "trainer.project_name": t.wandb_project,
        "trainer.experiment_name": experiment_name,
        "trainer.default_local_dir": str(RunDir(run_dir).checkpoints.root),
        "trainer.device": "cuda",
        "trainer.use_v1": True,
        "trainer.v1.trainer_mode": TRAINER_MODE,
        "trainer.log_val_generations": 0,
    }


def to_verl_config(cfg: C.Recipe, run_dir: str | os.PathLike[str] | None = None,
                   overrides: Sequence[str] = ()) -> DictConfig:
    """verl's default trainer config with our recipe's values; the recipe rides along under `seal`.

    Args:
        cfg: a composed, validated recipe (`seal.recipe.load_config`).
        run_dir: the run directory (default `seal.recipe.run_dir(cfg)`), made absolute.
        overrides: extra verl dotted overrides applied last (`key=value`, YAML values), for knobs our
            recipe does not carry (e.g. `actor_rollout_ref.rollout.agent.num_workers=16`). A key missing
            from verl's defaults is an error unless written `+key=value` (Hydra's convention).
    """
    if cfg.engine != "verl":
        raise ValueError(f"to_verl_config needs engine: verl, the recipe says {cfg.engine!r}")
    run = Path(run_dir if run_dir is not None else C.run_dir(cfg)).resolve()
    verl_cfg = load_verl_defaults()
    for key, value in recipe_overrides(cfg, run).items():
        if key not in ADDED_KEYS and not _has_key(verl_cfg, key):
            raise KeyError(f"verl 0.9.1 has no config key {key!r} (our mapping is out of date)")
        _set(verl_cfg, key, value)
    for item in overrides:
        key, value, add = parse_verl_override(item)
        if not add and not _has_key(verl_cfg, key):
            from seal.recipe.spelling import did_you_mean, dotted_keys

            raise KeyError(f"verl override {item!r}: verl 0.9.1's defaults have no key {key!r}"
                           f"{did_you_mean(key, dotted_keys(verl_cfg))} (check the spelling, or write "
                           f"+verl.{key}=... on the launcher's command line to add a key verl's defaults lack)")
        if add and _has_key(verl_cfg, key):
            raise KeyError(f"verl override {item!r}: {key!r} exists in verl's defaults; drop the '+'")
        if not add:
            check_verl_value(verl_cfg, key, value)
        _set(verl_cfg, key, value)
    for key in ("trainer.max_actor_ckpt_to_keep", "trainer.remove_previous_ckpt_in_save",
                "trainer.del_local_ckpt_after_load", "actor_rollout_ref.actor.checkpoint.async_save"):
        if OmegaConf.select(verl_cfg, key):  # whole folders deleted under best.json / files hashed mid-write
            raise ValueError(f"verl's {key} is not supported: trainer.keep_full_checkpoints is the checkpoint "
                             "policy (docs/verl_engine.md, 'The checkpoint policy')")
    with open_dict(verl_cfg):
        verl_cfg.seal = {"run_dir": str(run), "recipe": C.to_container(cfg)}
    return verl_cfg


def parse_verl_override(item: str) -> tuple[str, Any, bool]:
    """`key=value` (a key of verl's defaults) or `+key=value` (a key verl's defaults lack), Hydra's
    convention; the value is YAML. Returns (key, value, add)."""
    text = str(item).strip()
    add = text.startswith("+")
    key, sep, raw = text.lstrip("+").partition("=")
    key = key.strip()
    if not sep or not key or any(not part for part in key.split(".")):
        raise KeyError(f"verl override {item!r}: expected <verl key>=<value> or +<verl key>=<value>")
    return key, OmegaConf.from_dotlist([f"v={raw}"]).v, add


def verl_key_type(cfg: DictConfig, key: str) -> type | None:
    """The scalar type verl declares for `key` (bool, int, float or str), or None when it declares none.

    From the field of the dataclass verl binds the key's section to (its `_target_`, e.g.
    `verl.workers.config.RolloutConfig`), else from the kind of verl's default value."""
    parent, _, leaf = key.rpartition(".")
    target = OmegaConf.select(cfg, f"{parent}._target_" if parent else "_target_", default=None)
    if isinstance(target, str) and target.startswith("verl."):
        import dataclasses
        import importlib
        import typing

        module, _, name = target.rpartition(".")
        try:
            cls = getattr(importlib.import_module(module), name)
            hints = typing.get_type_hints(cls) if dataclasses.is_dataclass(cls) else {}
        except Exception:  # an unimportable target (e.g. a GPU-only module): fall back to the default's kind
            hints = {}
        declared = hints.get(leaf)
        args = [a for a in typing.get_args(declared) if a is not type(None)]
        if declared in (bool, int, float, str):
            return declared
        if len(args) == 1 and args[0] in (bool, int, float, str):  # Optional[X]
            return args[0]
    default = OmegaConf.select(cfg, key, default=None, throw_on_missing=False)
    return type(default) if type(default) in (bool, int, float, str) else None


def check_verl_value(cfg: DictConfig, key: str, value: Any) -> None:
    """Refuse a verl override whose value is not of the type verl's config declares for the key (verl's own
    schema is only applied later, on GPU workers, or not at all): `num_workers=sixteen` fails here."""
    expected = verl_key_type(cfg, key)
    if expected is None or value is None:
        return
    fits = {bool: isinstance(value, bool), int: isinstance(value, int) and not isinstance(value, bool),
            float: isinstance(value, (int, float)) and not isinstance(value, bool),
            str: isinstance(value, (str, int, float)) and not isinstance(value, bool)}[expected]
    if not fits:
        raise KeyError(f"verl override {key}={value!r}: verl's config declares {key!r} as {expected.__name__}, "
                       f"got {type(value).__name__}")


def _set(cfg: DictConfig, key: str, value: Any) -> None:
    with open_dict(cfg):
        OmegaConf.update(cfg, key, value, merge=False, force_add=True)


def _has_key(cfg: DictConfig, dotted: str) -> bool:
    *sections, last = dotted.split(".")
    node: Any = cfg
    for part in sections:
        # An interpolated node is a value, not a section (reading it would resolve it).
        if not isinstance(node, DictConfig) or part not in node or OmegaConf.is_interpolation(node, part):
            return False
        node = node[part]
    return isinstance(node, DictConfig) and last in node

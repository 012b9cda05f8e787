"""Recipes: the typed schema of a run (`schema`), loading `exp/*.yaml` into it (`compose`), what the
engines derive from it (`derived`) and the generated reference (`reference`; docs/config.md).

    cfg = load_config("exp/SEAL.yaml", ["rollout.n=4"])    # a frozen, validated `Recipe`
    cfg.rollout.n, cfg.seal.apatch_config, save_config(cfg, run / "config.yaml")
"""

from seal.recipe.compose import (
    DEFAULT_RECIPE,
    DEFAULTS_NAME,
    EXP_DIR,
    REPO_ROOT,
    from_container,
    load_config,
    load_saved_config,
    parse_overrides,
    replaced,
    save_config,
    schema,
    to_container,
    to_yaml,
    validate,
)
from seal.recipe.derived import (
    VALIDATE_AT_END_ONLY,
    VALIDATE_NEVER,
    env_service_args,
    rollout_limits,
    run_dir,
    sampling_params,
    steps_per_epoch,
    total_training_steps,
    validates_at,
)
from seal.recipe.paths import model_dir, model_path_value, with_input_paths
from seal.recipe.schema import (
    ActorConfig,
    AlgorithmConfig,
    ConfigError,
    DataConfig,
    EnvConfig,
    ModelConfig,
    Recipe,
    RolloutConfig,
    StepLimitConfig,
    TinyModelConfig,
    TrainerConfig,
)

__all__ = [
    "VALIDATE_AT_END_ONLY",
    "VALIDATE_NEVER",
    "validates_at",
    "DEFAULTS_NAME", "DEFAULT_RECIPE", "EXP_DIR", "REPO_ROOT", "ActorConfig", "AlgorithmConfig", "ConfigError",
    "DataConfig", "EnvConfig", "ModelConfig", "Recipe", "RolloutConfig", "StepLimitConfig", "TinyModelConfig",
    "TrainerConfig", "env_service_args", "from_container", "load_config", "load_saved_config", "model_dir",
    "model_path_value",
    "parse_overrides", "replaced",
    "rollout_limits", "run_dir", "sampling_params", "save_config", "schema", "steps_per_epoch", "to_container",
    "to_yaml", "total_training_steps", "validate", "with_input_paths",
]

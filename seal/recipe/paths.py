"""A recipe's input paths: made absolute by the one rule (`seal.io_utils.input_path`), and the model a run loads."""

from __future__ import annotations

from seal.io_utils import input_path
from seal.models import builtin_model, is_builtin
from seal.recipe.compose import replaced
from seal.recipe.schema import ConfigError, Recipe


def model_path_value(path: str, build_tiny: bool) -> str:
    """`model.path` after the input-path rule (`seal.io_utils.input_path`): a built-in name (`builtin:smollm2`) as
    given; a local directory, or with `build_tiny` the directory to build, made absolute; anything else (a hub
    id) as given."""
    if is_builtin(path):
        return path
    local = input_path(path)
    return str(local) if build_tiny or local.exists() else path


def with_input_paths(cfg: Recipe) -> Recipe:
    """`cfg` with every input path made absolute by the one rule (`seal.io_utils.input_path`): the data files,
    `model.path` (`model_path_value`) and `model.warm_start.path`. A missing data file is a `ConfigError` now,
    before any run directory or service exists. Outputs (`trainer.run_root`) stay relative to the cwd."""
    files = {key: input_path(getattr(cfg.data, key)) for key in ("train_files", "val_files")}
    missing = [f"data.{key} = {getattr(cfg.data, key)} (looked at {path})" for key, path in files.items()
               if not path.is_file()]
    if missing:
        raise ConfigError("data file not found: " + "; ".join(missing) + ". Relative paths are taken from the cwd "
                          "when they exist there, else from the project root (docs/config.md)")
    model = replaced(
        cfg.model, path=model_path_value(cfg.model.path, cfg.model.build_tiny),
        warm_start=replaced(cfg.model.warm_start, path=str(input_path(cfg.model.warm_start.path))))
    data = replaced(cfg.data, **{key: str(path) for key, path in files.items()})
    return replaced(cfg, data=data, model=model)


def model_dir(cfg: Recipe) -> str:
    """The model directory a run loads: a built-in model's cached build (built when missing); with
    `model.build_tiny` the tiny random Qwen2, built first when missing (only inside the model cache,
    `seal.models.tiny.prepare_tiny_model`); a local directory, absolute; else a hub id as given."""
    if is_builtin(cfg.model.path):
        return str(builtin_model(cfg.model.path))
    if cfg.model.build_tiny:
        from seal.models.tiny import prepare_tiny_model

        # hidden, layers, seed, heads, kv_heads
        return str(prepare_tiny_model(input_path(cfg.model.path), **dict(cfg.model.tiny)))
    return model_path_value(cfg.model.path, build_tiny=False)

"""Recipe configuration: compose `exp/*.yaml`, validate it, and build the typed configs from it.

The contract (every key, its default and its source) is `docs/config.md`; the values live in
`exp/defaults.yaml`. A recipe is a short diff::

    defaults: [defaults, _self_]     # names of YAML files next to the recipe, merged in order
    experiment_name: SEAL
    model: {path: Qwen/Qwen2.5-7B-Instruct}

Composition follows Hydra's defaults-list semantics for this simple case (each entry is another
recipe in the same directory, possibly with its own defaults list; `_self_` marks where the recipe's
own body is merged; without `_self_` the body comes last) and is done with OmegaConf merges, so
loading a recipe needs no global Hydra state. Dotted overrides (`rollout.n=4`, values parsed as
YAML) are applied last. Every key must exist in `exp/defaults.yaml`: a typo is an error, not a
silently ignored knob. The few open mappings (`seal.apatch.tag_weights`, `seal.interface.cue_texts`)
accept any key; their contents are checked by the SEAL core dataclasses.

Explicit zeros stay zeros everywhere: nothing here reads a value with `value or default`.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, ListConfig, OmegaConf
from omegaconf.errors import ConfigKeyError, OmegaConfBaseException

from seal.core.apatch import APatchConfig
from seal.core.capability import DynamicWeightConfig
from seal.core.evolve import EvolveConfig
from seal.core.reward import RewardConfig
from seal.rollout.types import RolloutLimits, SamplingParams

REPO_ROOT = Path(__file__).resolve().parent.parent
EXP_DIR = REPO_ROOT / "exp"
DEFAULTS_NAME = "defaults"
DEFAULT_RECIPE = EXP_DIR / "tiny_cpu.yaml"

ENGINES = ("verl", "local")
DTYPES = ("bfloat16", "float16", "float32")
STEP_LIMIT_SCOPES = ("episode", "turn")
VOCABULARIES = ("progress", "paper")
LOGGERS = ("console", "jsonl", "wandb")
# verl.trainer.ppo.core_algos.kl_penalty / agg_loss accept these.
KL_TYPES = ("kl", "k1", "abs", "mse", "k2", "low_var_kl", "k3", "full")
LOSS_AGG_MODES = ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm")
# A-Patch is defined on top of GRPO's group-relative advantages (docs/paper.md §5).
ADV_ESTIMATORS = ("grpo",)

# Mappings whose keys are free (checked by the SEAL core dataclasses instead).
OPEN_MAPPINGS = ("seal.apatch.tag_weights", "seal.interface.cue_texts")
# Keys whose default is null, with the types they may hold otherwise.
NULLABLE: dict[str, tuple[type, ...]] = {
    "data.max_train_tasks": (int,),
    "data.max_val_tasks": (int,),
    "trainer.total_training_steps": (int,),
    "rollout.max_observation_tokens": (int,),
    "seal.apatch.tags_key": (str,),
    "seal.interface.error_tags": (list,),
}
# Keys of seal.interface that are ours (not EvolveConfig fields).
INTERFACE_SWITCHES = ("enable", "closed_loop")


class ConfigError(ValueError):
    """A recipe or override that does not compose or does not validate."""


# --------------------------------------------------------------------------- composition
def _recipe_path(name: str, base_dir: Path) -> Path:
    path = Path(name)
    if path.suffix not in (".yaml", ".yml"):
        path = path.with_suffix(".yaml")
    if not path.is_absolute():
        path = base_dir / path
    return path


def _compose_file(path: Path, stack: tuple[Path, ...]) -> DictConfig:
    """The recipe at `path` with its defaults list merged (no validation yet)."""
    path = path.resolve()
    if path in stack:
        chain = " -> ".join(p.name for p in (*stack, path))
        raise ConfigError(f"recipe defaults form a cycle: {chain}")
    if not path.is_file():
        raise ConfigError(f"recipe not found: {path}")
    try:
        raw = OmegaConf.load(path)
    except (OmegaConfBaseException, OSError, ValueError) as exc:
        raise ConfigError(f"cannot read recipe {path}: {exc}") from exc
    if not isinstance(raw, DictConfig):
        raise ConfigError(f"recipe {path} must be a YAML mapping")
    defaults = raw.pop("defaults", None)
    raw.pop("hydra", None)  # a Hydra-only block has no meaning here
    if defaults is None:
        defaults = [] if path.stem == DEFAULTS_NAME else [DEFAULTS_NAME, "_self_"]
    if not isinstance(defaults, ListConfig) and not isinstance(defaults, list):
        raise ConfigError(f"{path.name}: 'defaults' must be a list of recipe names")
    entries = [str(e) for e in defaults]
    if "_self_" not in entries:
        entries.append("_self_")
    parts: list[DictConfig] = []
    for entry in entries:
        if entry == "_self_":
            parts.append(raw)
        else:
            parts.append(_compose_file(_recipe_path(entry, path.parent), (*stack, path)))
    return OmegaConf.merge(*parts) if parts else OmegaConf.create({})


def _schema(defaults_path: Path) -> DictConfig:
    schema = _compose_file(defaults_path, ())
    OmegaConf.set_struct(schema, True)
    for key in OPEN_MAPPINGS:
        node = OmegaConf.select(schema, key)
        if node is not None:
            OmegaConf.set_struct(node, False)
    return schema


def _merge_strict(base: DictConfig, update: DictConfig | dict, where: str) -> DictConfig:
    try:
        return OmegaConf.merge(base, update)
    except ConfigKeyError as exc:
        key = getattr(exc, "full_key", None) or str(exc)
        raise ConfigError(f"{where}: unknown key {key!r} (every key must exist in exp/defaults.yaml)") from exc
    except OmegaConfBaseException as exc:
        raise ConfigError(f"{where}: {exc}") from exc


def parse_overrides(overrides: Iterable[str]) -> DictConfig:
    """Dotted `key=value` overrides (values parsed as YAML: `rollout.n=4`, `env.urls=[http://h:1]`)."""
    items = []
    for item in overrides:
        item = str(item)
        if item.startswith("+"):  # Hydra's "add a key" prefix: keys must exist anyway
            item = item[1:]
        if "=" not in item or item.startswith("="):
            raise ConfigError(f"override {item!r} is not key=value")
        items.append(item)
    try:
        return OmegaConf.from_dotlist(items)
    except OmegaConfBaseException as exc:
        raise ConfigError(f"bad override: {exc}") from exc


def load_config(path: str | Path | None = None, overrides: Sequence[str] = ()) -> DictConfig:
    """Compose `exp/defaults.yaml` + the recipe at `path` (+ its defaults list) + `overrides`, resolve
    interpolations and validate. `path=None` loads the embedded default recipe (`exp/tiny_cpu.yaml`).

    Raises `ConfigError` for an unknown key, a wrong type, a value out of range or an unknown enum.
    The defaults file is the `defaults.yaml` next to the recipe when there is one, else `exp/`'s.
    """
    recipe = Path(path) if path is not None else DEFAULT_RECIPE
    if not recipe.is_file():
        raise ConfigError(f"recipe not found: {recipe}")
    defaults_path = recipe.resolve().parent / f"{DEFAULTS_NAME}.yaml"
    if not defaults_path.is_file():
        defaults_path = EXP_DIR / f"{DEFAULTS_NAME}.yaml"
    schema = _schema(defaults_path)
    composed = _compose_file(recipe, ())
    cfg = _merge_strict(schema, composed, f"recipe {recipe.name}")
    cfg = _merge_strict(cfg, parse_overrides(overrides), "overrides")
    try:
        OmegaConf.resolve(cfg)
    except OmegaConfBaseException as exc:
        raise ConfigError(f"cannot resolve interpolations: {exc}") from exc
    validate(cfg, schema)
    return cfg


def to_container(cfg: DictConfig) -> dict[str, Any]:
    """Plain (resolved) dicts and lists."""
    out = OmegaConf.to_container(cfg, resolve=True)
    assert isinstance(out, dict)
    return out


def save_config(cfg: DictConfig, path: str | Path) -> Path:
    """Write the resolved config as YAML (the run directory's `config.yaml`)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(OmegaConf.to_yaml(cfg, resolve=True), encoding="utf-8")
    return path


# --------------------------------------------------------------------------- validation
def _kind(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int):
        return "int"
    if isinstance(value, float):
        return "float"
    if isinstance(value, str):
        return "str"
    if isinstance(value, (list, tuple, ListConfig)):
        return "list"
    if isinstance(value, (dict, DictConfig)):
        return "dict"
    return type(value).__name__


_PY_KIND = {int: "int", str: "str", list: "list", float: "float", bool: "bool"}


def _check_types(value: Any, default: Any, key: str, errors: list[str]) -> None:
    if key in OPEN_MAPPINGS:
        if _kind(value) not in ("dict", "null"):
            errors.append(f"{key}: expected a mapping, got {_kind(value)}")
        return
    if isinstance(default, DictConfig):
        if not isinstance(value, DictConfig):
            errors.append(f"{key}: expected a mapping, got {_kind(value)}")
            return
        for sub in default:
            _check_types(value[sub], default[sub], f"{key}.{sub}" if key else str(sub), errors)
        return
    got = _kind(value)
    if default is None:
        allowed = {"null", *(_PY_KIND[t] for t in NULLABLE.get(key, ()))}
    else:
        allowed = {_kind(default)}
        if "float" in allowed:
            allowed.add("int")  # 1 is a fine float
    if got not in allowed:
        errors.append(f"{key}: expected {' or '.join(sorted(allowed))}, got {got} ({value!r})")


def _get(cfg: DictConfig, key: str) -> Any:
    return OmegaConf.select(cfg, key)


def validate(cfg: DictConfig, schema: DictConfig | None = None) -> None:
    """Check types (against `exp/defaults.yaml`), enums and ranges; build the SEAL core configs."""
    if schema is None:
        schema = _schema(EXP_DIR / f"{DEFAULTS_NAME}.yaml")
    errors: list[str] = []
    _check_types(cfg, schema, "", errors)
    if errors:
        raise ConfigError("invalid config:\n  " + "\n  ".join(errors))

    def enum(key: str, allowed: Sequence[str]) -> None:
        if _get(cfg, key) not in allowed:
            errors.append(f"{key}: must be one of {list(allowed)}, got {_get(cfg, key)!r}")

    def at_least(key: str, low: float, nullable: bool = False) -> None:
        value = _get(cfg, key)
        if value is None and nullable:
            return
        if value is None or not math.isfinite(value) or value < low:
            errors.append(f"{key}: must be >= {low}, got {value!r}")

    enum("engine", ENGINES)
    enum("model.dtype", DTYPES)
    enum("env.step_limit.scope", STEP_LIMIT_SCOPES)
    enum("seal.diagnosis.vocabulary", VOCABULARIES)
    enum("actor.kl_loss_type", KL_TYPES)
    enum("actor.loss_agg_mode", LOSS_AGG_MODES)
    enum("algorithm.adv_estimator", ADV_ESTIMATORS)
    for name in cfg.trainer.logger:
        if name not in LOGGERS:
            errors.append(f"trainer.logger: unknown logger {name!r}; known: {list(LOGGERS)}")
    if not cfg.experiment_name or "/" in cfg.experiment_name or cfg.experiment_name in (".", ".."):
        errors.append(f"experiment_name must be a plain directory name, got {cfg.experiment_name!r}")
    if not cfg.env.urls:
        errors.append("env.urls: at least one env-service URL is needed")
    for key in ("data.train_batch_size", "rollout.n", "rollout.val_n", "rollout.max_tokens_per_call",
                "rollout.max_model_len", "rollout.max_model_calls", "rollout.concurrency",
                "data.max_prompt_length", "data.max_response_length", "env.step_limit.max_steps",
                "actor.ppo_mini_batch_size", "actor.ppo_micro_batch_size_per_gpu", "actor.ppo_epochs",
                "trainer.total_epochs", "trainer.n_gpus_per_node", "trainer.nnodes",
                "rollout.tensor_parallel_size"):
        at_least(key, 1)
    for key in ("data.max_train_tasks", "data.max_val_tasks", "trainer.total_training_steps"):
        at_least(key, 1, nullable=True)
    for key in ("rollout.temperature", "rollout.val_temperature", "actor.lr", "actor.weight_decay",
                "actor.clip_ratio_low", "actor.clip_ratio_high", "actor.kl_loss_coef", "actor.entropy_coeff",
                "actor.grad_clip", "trainer.test_freq", "trainer.save_freq", "env.timeout_s",
                "env.max_retries", "env.max_restarts"):
        at_least(key, 0)
    top_p = _get(cfg, "rollout.top_p")
    if not 0.0 < top_p <= 1.0:
        errors.append(f"rollout.top_p must lie in (0, 1], got {top_p}")
    if cfg.rollout.top_k == 0 or cfg.rollout.top_k < -1:
        errors.append(f"rollout.top_k must be -1 (off) or positive, got {cfg.rollout.top_k}")
    if cfg.actor.clip_ratio_c <= 1.0:
        errors.append(f"actor.clip_ratio_c must be > 1 (dual-clip lower bound), got {cfg.actor.clip_ratio_c}")
    if not 0.0 < cfg.rollout.gpu_memory_utilization <= 1.0:
        errors.append(f"rollout.gpu_memory_utilization must lie in (0, 1], got {cfg.rollout.gpu_memory_utilization}")
    if cfg.data.max_prompt_length + cfg.data.max_response_length > cfg.rollout.max_model_len:
        # Release assertion (main_ppo): the whole sequence must fit the model's context.
        errors.append("data.max_prompt_length + data.max_response_length must be <= rollout.max_model_len")
    if cfg.data.train_batch_size % cfg.actor.ppo_mini_batch_size:
        errors.append("data.train_batch_size must be a multiple of actor.ppo_mini_batch_size")
    resume = cfg.trainer.resume
    if not resume:
        errors.append("trainer.resume: auto | disable | <checkpoint dir>")
    if cfg.model.build_tiny and cfg.engine != "local":
        errors.append("model.build_tiny is for engine: local only")
    if errors:
        raise ConfigError("invalid config:\n  " + "\n  ".join(errors))
    # The SEAL core dataclasses check their own knobs (unknown keys, ranges, tags).
    for build in (apatch_config, dynamic_weight_config, evolve_config, reward_config, rollout_limits):
        try:
            build(cfg)
        except (ValueError, TypeError) as exc:
            raise ConfigError(f"invalid config ({build.__name__}): {exc}") from exc


# --------------------------------------------------------------------------- typed accessors
def _section(cfg: DictConfig, key: str) -> dict[str, Any]:
    node = OmegaConf.select(cfg, key)
    if node is None:
        return {}
    out = OmegaConf.to_container(node, resolve=True)
    assert isinstance(out, dict)
    return out


def vocabulary(cfg: DictConfig) -> str:
    """The diagnosis vocabulary every SEAL component uses (`seal.diagnosis.vocabulary`)."""
    return str(cfg.seal.diagnosis.vocabulary)


def apatch_config(cfg: DictConfig) -> APatchConfig:
    return APatchConfig.from_dict({**_section(cfg, "seal.apatch"), "vocabulary": vocabulary(cfg)})


def dynamic_weight_config(cfg: DictConfig) -> DynamicWeightConfig:
    return DynamicWeightConfig.from_dict(_section(cfg, "seal.capability"))


def evolve_config(cfg: DictConfig) -> EvolveConfig:
    data = {k: v for k, v in _section(cfg, "seal.interface").items() if k not in INTERFACE_SWITCHES}
    return EvolveConfig.from_dict({**data, "vocabulary": vocabulary(cfg)})


def interface_enabled(cfg: DictConfig) -> bool:
    """False = raw interface: training episodes are created without any interface."""
    return bool(cfg.seal.interface.enable)


def interface_closed_loop(cfg: DictConfig) -> bool:
    """False = Ω_0 for the whole run (the "w/o closed-loop update" ablation)."""
    return bool(cfg.seal.interface.closed_loop)


def reward_config(cfg: DictConfig) -> RewardConfig:
    return RewardConfig.from_dict(_section(cfg, "seal.reward"))


def rollout_limits(cfg: DictConfig) -> RolloutLimits:
    return RolloutLimits(
        max_prompt_length=int(cfg.data.max_prompt_length),
        max_response_length=int(cfg.data.max_response_length),
        max_model_len=int(cfg.rollout.max_model_len),
        max_tokens_per_call=int(cfg.rollout.max_tokens_per_call),
        max_model_calls=int(cfg.rollout.max_model_calls),
        max_observation_tokens=(None if cfg.rollout.max_observation_tokens is None
                                else int(cfg.rollout.max_observation_tokens)),
    )


def sampling_params(cfg: DictConfig, mode: str = "train", seed: int | None = None) -> SamplingParams:
    """Training sampling (temperature/top_p/top_k) or validation decoding (greedy by default)."""
    if mode == "train":
        return SamplingParams(temperature=float(cfg.rollout.temperature), top_p=float(cfg.rollout.top_p),
                              top_k=int(cfg.rollout.top_k), seed=seed)
    if mode in ("val", "eval"):
        # Release validation: temperature 0, top_p 1.0, top_k -1 (docs/release_behaviour.md §8.1).
        return SamplingParams(temperature=float(cfg.rollout.val_temperature), top_p=1.0, top_k=-1, seed=seed)
    raise ValueError(f"mode must be 'train' or 'val', got {mode!r}")


def steps_per_epoch(cfg: DictConfig, num_train_tasks: int) -> int:
    """Full batches per epoch (the release's loader drops the last partial batch: 400 / 32 = 12)."""
    steps = num_train_tasks // int(cfg.data.train_batch_size)
    if steps < 1:
        raise ConfigError(f"{num_train_tasks} training tasks are fewer than data.train_batch_size "
                          f"= {cfg.data.train_batch_size}")
    return steps


def total_training_steps(cfg: DictConfig, num_train_tasks: int) -> int:
    """`trainer.total_training_steps` when set, else epochs x steps per epoch (paper: 6 x 12 = 72)."""
    if cfg.trainer.total_training_steps is not None:
        return int(cfg.trainer.total_training_steps)
    return int(cfg.trainer.total_epochs) * steps_per_epoch(cfg, num_train_tasks)


def run_dir(cfg: DictConfig, root: str | Path | None = None) -> Path:
    """`<run_root>/<experiment_name>`; a relative `run_root` is taken from `root` (default: the cwd)."""
    base = Path(cfg.run_root)
    if not base.is_absolute() and root is not None:
        base = Path(root) / base
    return base / str(cfg.experiment_name)


def env_service_args(cfg: DictConfig) -> list[str]:
    """`python -m env_service` flags carrying the recipe's environment settings."""
    args = ["--step-limit-scope", str(cfg.env.step_limit.scope), "--max-steps", str(int(cfg.env.step_limit.max_steps))]
    if not cfg.env.strict_availability:
        args.append("--no-strict-availability")
    return args


def as_plain(value: Any) -> Any:
    """A plain Python value from an OmegaConf node (or the value itself)."""
    if isinstance(value, (DictConfig, ListConfig)):
        return OmegaConf.to_container(value, resolve=True)
    if isinstance(value, Mapping):
        return dict(value)
    return value

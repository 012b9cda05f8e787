"""Loading a recipe: compose `exp/*.yaml` and the overrides into one tree, then validate it into a `Recipe`.

A recipe is a short diff::

    defaults: [defaults, _self_]     # names of YAML files next to the recipe, merged in order
    experiment_name: SEAL
    model: {path: Qwen/Qwen2.5-7B-Instruct}

Composition follows Hydra's defaults-list semantics for this simple case (each entry is another recipe in the
same directory, possibly with its own defaults list; `_self_` marks where the recipe's own body is merged; without
`_self_` the body comes last) and is done with plain OmegaConf merges over the schema's defaults, so loading a
recipe needs no global Hydra state. Dotted overrides (`rollout.n=4`, values parsed as YAML, Hydra's `+key=`
accepted) are applied last. OmegaConf only composes and resolves `${...}` interpolations here; every key, type,
range and cross-key rule is the pydantic schema's (`seal.recipe.schema`, `seal.core.*`), which reports every
problem of a load at once, each naming its key (`seal.recipe.problems`).

`load_config` returns the frozen `Recipe` model: the engines read typed attributes, nothing changes the run's config
after it was saved, and no invalid recipe exists (`replaced` validates a changed copy again); `save_config` writes it.

Interpolations may not read the environment (`${oc.env:...}`, `${oc.decode:...}`; refused before resolving), and
no resolved value may hold a known secret's value (`seal.redact`): a recipe's values go into the run
directory's name, `config.yaml` and the wandb run.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

from omegaconf import DictConfig, ListConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException
from pydantic import BaseModel, ValidationError

from seal.io_utils import PROJECT_ROOT, input_path
from seal.recipe.problems import leaves, messages, secret_problems
from seal.recipe.schema import ConfigError, Recipe
from seal.recipe.spelling import keep_string_words

REPO_ROOT = PROJECT_ROOT
EXP_DIR = REPO_ROOT / "exp"
DEFAULTS_NAME = "defaults"
DEFAULT_RECIPE = EXP_DIR / "tiny_cpu.yaml"
M = TypeVar("M", bound=BaseModel)


# --------------------------------------------------------------------------- composition
def _recipe_path(name: str, base_dir: Path) -> Path:
    path = Path(name)
    if path.suffix not in (".yaml", ".yml"):
        path = path.with_suffix(".yaml")
    return path if path.is_absolute() else base_dir / path


def _compose_file(path: Path, stack: tuple[Path, ...]) -> DictConfig:
    """The recipe at `path` with its defaults list merged (unchecked: the schema checks the whole tree)."""
    path = path.resolve()
    if path in stack:
        raise ConfigError(f"recipe defaults form a cycle: {' -> '.join(p.name for p in (*stack, path))}")
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
    if not isinstance(defaults, (ListConfig, list)):
        raise ConfigError(f"{path.name}: 'defaults' must be a list of recipe names")
    entries = [str(e) for e in defaults]
    if "_self_" not in entries:
        entries.append("_self_")
    parts = [raw if e == "_self_" else _compose_file(_recipe_path(e, path.parent), (*stack, path)) for e in entries]
    merged = OmegaConf.merge(*parts) if parts else OmegaConf.create({})
    assert isinstance(merged, DictConfig)
    return merged


def parse_overrides(overrides: Iterable[str]) -> DictConfig:
    """Dotted `key=value` overrides (values parsed as YAML: `rollout.n=4`, `env.urls=[http://h:1]`)."""
    items = []
    for item in map(str, overrides):
        item = item.removeprefix("+")  # Hydra's "add a key" prefix: keys must exist anyway
        if "=" not in item or item.startswith("="):
            raise ConfigError(f"override {item!r} is not key=value")
        items.append(item)
    try:
        return OmegaConf.from_dotlist(items)
    except OmegaConfBaseException as exc:
        raise ConfigError(f"bad override: {exc}") from exc


def schema() -> DictConfig:
    """Every key with its default, as a plain OmegaConf tree: what a recipe is merged over (so interpolations
    can read any key, and a recipe without a defaults list still has every key)."""
    return OmegaConf.create(to_container(Recipe()))


def _merge(parts: Sequence[tuple[DictConfig, str]]) -> tuple[DictConfig, dict[str, str]]:
    """`schema()` with each part merged in order, and which part (`recipe X.yaml`, `overrides`) set each key."""
    origins = {key.split("[")[0]: where for part, where in parts
               for key, _ in leaves(OmegaConf.to_container(part, resolve=False))}
    try:
        merged = OmegaConf.merge(schema(), *(part for part, _ in parts))
    except OmegaConfBaseException as exc:
        raise ConfigError(f"cannot merge the recipe: {str(exc).splitlines()[0]}") from exc
    assert isinstance(merged, DictConfig)
    return merged, origins


# --------------------------------------------------------------------------- validating
def _to_recipe(cfg: DictConfig, origins: Mapping[str, str]) -> Recipe:
    secret = secret_problems(OmegaConf.to_container(cfg, resolve=False), {})
    if secret:  # refused before resolving: resolving would read the variables
        raise ConfigError.listing(secret)
    try:
        data = OmegaConf.to_container(cfg, resolve=True)
    except OmegaConfBaseException as exc:
        raise ConfigError.listing([f"cannot resolve interpolations: {str(exc).splitlines()[0]}"]) from exc
    problems = secret_problems({}, data)
    try:
        recipe = Recipe.model_validate(data)
    except ValidationError as exc:
        problems += messages(Recipe, exc, schema(), origins)
    if problems:
        raise ConfigError.listing(problems)
    return recipe


def load_config(path: str | Path | None = None, overrides: Sequence[str] = ()) -> Recipe:
    """Compose the recipe at `path` (+ its defaults list) + `overrides`, resolve interpolations and validate the
    `Recipe`. `path=None` loads the embedded default (`exp/tiny_cpu.yaml`).

    A relative `path` follows the input-path rule (`seal.io_utils.input_path`): from the cwd when it exists
    there, else from the project. Raises `ConfigError` listing every unknown key, wrong type, value out of
    range and unknown enum value (and, once those are fixed, every broken cross-key rule).
    """
    recipe = input_path(path) if path is not None else DEFAULT_RECIPE
    if not recipe.is_file():
        where = "" if Path(str(path)).expanduser().is_absolute() else " (looked in the cwd, then the project)"
        raise ConfigError(f"recipe not found: {path}{where}")
    composed = _compose_file(recipe, ())
    words = keep_string_words(overrides, OmegaConf.merge(schema(), composed))
    return _to_recipe(*_merge([(composed, f"recipe {recipe.name}"), (parse_overrides(words), "overrides")]))


def from_container(data: Recipe | Mapping[str, Any] | DictConfig) -> Recipe:
    """The `Recipe` of a plain mapping with every key (a saved `config.yaml`, the recipe inside a verl
    config), checked like a loaded recipe. A `Recipe` is returned as it is."""
    if isinstance(data, Recipe):
        return data
    if not isinstance(data, (Mapping, DictConfig)):
        raise ConfigError(f"a recipe must be a mapping, got {type(data).__name__}")
    return _to_recipe(*_merge([(OmegaConf.create(to_container(data)), "config")]))


def replaced(section: M, **changes: Any) -> M:
    """A copy of the recipe or one of its sections with `changes`, validated again like a loaded recipe (pydantic's
    `model_copy` is not): the one way to change a value, `replaced(cfg, env=replaced(cfg.env, urls=(url,)))`.
    Problems are named from `section` down (`n`, or `rollout.n` for `replaced(cfg, rollout=...)`)."""
    try:
        return type(section).model_validate({**dict(section), **changes})
    except ValidationError as exc:
        raise ConfigError.listing(messages(type(section), exc, to_container(section), {})) from exc


def validate(data: Recipe | Mapping[str, Any] | DictConfig) -> None:
    """Raise `ConfigError` unless `data` is a valid recipe (see `from_container`)."""
    from_container(data)


def to_container(cfg: BaseModel | Mapping[str, Any] | DictConfig) -> dict[str, Any]:
    """Plain (resolved) dicts and lists of a recipe or any of its sections, keys in schema order."""
    if isinstance(cfg, BaseModel):
        return cfg.model_dump(mode="json")
    out = OmegaConf.to_container(cfg if isinstance(cfg, DictConfig) else OmegaConf.create(dict(cfg)), resolve=True)
    assert isinstance(out, dict)
    return out


def to_yaml(cfg: Recipe) -> str:
    """The resolved config as YAML, keys in schema order."""
    return OmegaConf.to_yaml(OmegaConf.create(to_container(cfg)))


def save_config(cfg: Recipe, path: str | Path) -> Path:
    """Write the resolved config as YAML (the run directory's `config.yaml`)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(to_yaml(cfg), encoding="utf-8")
    return path


def load_saved_config(path: str | Path) -> Recipe:
    """A run directory's `config.yaml` (`save_config`'s resolved YAML, no defaults list) as a checked `Recipe`."""
    return from_container(OmegaConf.load(Path(path)))

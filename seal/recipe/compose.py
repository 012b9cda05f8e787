"""Loading a recipe: compose `exp/*.yaml`, merge it into the schema, build the typed `Recipe`.

A recipe is a short diff::

    defaults: [defaults, _self_]     # names of YAML files next to the recipe, merged in order
    experiment_name: SEAL
    model: {path: Qwen/Qwen2.5-7B-Instruct}

Composition follows Hydra's defaults-list semantics for this simple case (each entry is another
recipe in the same directory, possibly with its own defaults list; `_self_` marks where the recipe's
own body is merged; without `_self_` the body comes last) and is done with OmegaConf merges, so
loading a recipe needs no global Hydra state. Dotted overrides (`rollout.n=4`, values parsed as
YAML, Hydra's `+key=` accepted) are applied last.

The merge target is `OmegaConf.structured(Recipe)`, so OmegaConf does the key and type checking: a
typo is an unknown key, `rollout.n=four` a wrong type. OmegaConf also converts between kinds
(`1` -> `true`, `"4"` -> `4`, `4` -> `"4"`); a recipe that relies on that is refused too, so a value
means what it says (an int where a float is expected is fine). Every problem of a load is reported
at once, each naming its key. Only OmegaConf's public API is used (structured configs, merge, the
errors' `full_key` / `value`; pinned in pyproject.toml): what a key expects is read from the
dataclasses' type hints, and the sections are built from plain containers.

`load_config` returns the `Recipe` dataclass itself rather than a structured `DictConfig`: the
engines and the controller then read plain typed attributes (`cfg.rollout.n` is an `int` to a type
checker, too, so no casts), the object is frozen (nothing changes the run's config after it was
saved), and building it runs every range and cross-key check (`Recipe.__post_init__`), so an
invalid recipe cannot exist. `to_container` / `save_config` turn it back into plain YAML.

Explicit zeros stay zeros everywhere: nothing here reads a value with `value or default`.

Interpolations may not read the environment (`${oc.env:...}`, `${oc.decode:...}`; refused before resolving), and
no resolved value may hold a known secret's value (`seal.redact`): a recipe's values go into the run
directory's name, `config.yaml` and the wandb run.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import re
import types
import typing
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from omegaconf import DictConfig, ListConfig, OmegaConf
from omegaconf.errors import ConfigKeyError, OmegaConfBaseException

from seal.core.config_parsing import knob_problems, type_name
from seal.io_utils import PROJECT_ROOT, input_path
from seal.models import builtin_model, is_builtin
from seal.recipe.schema import ConfigError, Recipe
from seal.recipe.spelling import did_you_mean, dotted_keys, keep_string_words

REPO_ROOT = PROJECT_ROOT
EXP_DIR = REPO_ROOT / "exp"
DEFAULTS_NAME = "defaults"
DEFAULT_RECIPE = EXP_DIR / "tiny_cpu.yaml"
# Said for a `vocabulary` key anywhere else: A-Patch and interface evolution have none of their own.
_VOCABULARY_HINT = "the vocabulary is chosen once, by seal.diagnosis.vocabulary"


# --------------------------------------------------------------------------- composition
def _recipe_path(name: str, base_dir: Path) -> Path:
    path = Path(name)
    if path.suffix not in (".yaml", ".yml"):
        path = path.with_suffix(".yaml")
    if not path.is_absolute():
        path = base_dir / path
    return path


def _compose_file(path: Path, stack: tuple[Path, ...]) -> DictConfig:
    """The recipe at `path` with its defaults list merged (untyped; checked by the merge into the schema)."""
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
    if not isinstance(defaults, (ListConfig, list)):
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
    merged = OmegaConf.merge(*parts) if parts else OmegaConf.create({})
    assert isinstance(merged, DictConfig)
    return merged


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


# --------------------------------------------------------------------------- typed merge
def schema() -> DictConfig:
    """`OmegaConf.structured(Recipe)`, writable (each frozen dataclass makes its section read-only)."""
    cfg = OmegaConf.structured(Recipe)

    def writable(node: DictConfig) -> None:
        OmegaConf.set_readonly(node, None)
        for key in node:
            child = node[key]
            if isinstance(child, DictConfig):
                writable(child)

    writable(cfg)
    return cfg


def _declared(key: str) -> Any:
    """The type the schema declares at dotted `key` (`rollout.n`, `env.urls[0]`, `seal.apatch.tag_weights.pass`),
    read from the dataclasses' type hints; None where it declares none."""
    hint: Any = Recipe
    for part in key.replace("[", ".[").split("."):
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        if typing.get_origin(hint) in (typing.Union, types.UnionType) and len(args) == 1:  # `X | None`: X
            hint = args[0]
            args = list(typing.get_args(hint))
        if dataclasses.is_dataclass(hint):
            hint = typing.get_type_hints(hint).get(part)
        elif typing.get_origin(hint) in (list, tuple) and part.startswith("["):
            hint = args[0]
        elif typing.get_origin(hint) is dict:
            hint = args[1]
        else:
            return None
    return hint


def _expected(key: str) -> str:
    """What the schema accepts at dotted `key` (for a type error's message)."""
    hint = _declared(key)
    return "mapping" if dataclasses.is_dataclass(hint) else "?" if hint is None else type_name(hint)


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    for kind in (bool, int, float, str, list, dict):
        if isinstance(value, kind):
            return kind.__name__
    return type(value).__name__


def _drop(cfg: DictConfig, key: str) -> bool:
    """Remove dotted `key` (a list item: the whole list) from `cfg`; False when it is not there."""
    *parents, last = key.split("[")[0].split(".")
    node: Any = cfg
    for part in parents:
        if not isinstance(node, DictConfig) or part not in node:
            return False
        node = node[part]
    if not isinstance(node, DictConfig) or last not in node:
        return False
    del node[last]
    return True


def _coercions(raw: Any, merged: Any, key: str, where: str) -> list[str]:
    """Leaves whose kind OmegaConf changed while merging `raw` (plain containers, unresolved)."""
    if isinstance(raw, dict):
        if not isinstance(merged, dict):
            return []
        return [p for k, v in raw.items() for p in _coercions(v, merged.get(k), f"{key}.{k}" if key else str(k), where)]
    if isinstance(raw, list):
        if not isinstance(merged, list) or len(merged) != len(raw):
            return []
        pairs = enumerate(zip(raw, merged, strict=True))
        return [p for i, (r, m) in pairs for p in _coercions(r, m, f"{key}[{i}]", where)]
    if raw is None or (isinstance(raw, str) and "${" in raw):  # null, or an interpolation resolved later
        return []
    got, want = _kind(raw), _kind(merged)
    if got == want or (got == "int" and want == "float"):  # 1 is a fine float
        return []
    return [f"{key}: expected {want}, got {got} ({raw!r}) (from {where})"]


def _scalar_section(raw: Any, cls: type = Recipe, prefix: str = "") -> str:
    """The first key where `raw` holds a non-mapping and the schema a section ("" if none): OmegaConf's
    error for it names no key."""
    if not isinstance(raw, dict):
        return ""
    hints = typing.get_type_hints(cls)
    for k, v in raw.items():
        section = hints.get(k)
        if dataclasses.is_dataclass(section):
            key = f"{prefix}.{k}" if prefix else str(k)
            found = _scalar_section(v, section, key) if isinstance(v, dict) else key
            if found:
                return found
    return ""


def _merge(target: DictConfig, update: DictConfig, where: str, problems: list[str]) -> DictConfig:
    """`target` merged with `update`; each unknown key or bad type goes to `problems` and is skipped."""
    update = copy.deepcopy(update)  # refused keys are dropped from it
    for _ in range(1000):  # one retry per refused key, far more than any recipe has
        try:
            merged = OmegaConf.merge(target, update)
        except OmegaConfBaseException as exc:
            key = str(exc.full_key or "")
            if isinstance(exc, ConfigKeyError):
                hint = _VOCABULARY_HINT if key.endswith(".vocabulary") else "every key is listed in docs/config.md"
                problems.append(f"{key}: unknown key {key!r}{did_you_mean(key, dotted_keys(target))} "
                                f"(from {where}; {hint})")
            elif key:
                problems.append(f"{key}: expected {_expected(key)}, got {_kind(exc.value)} ({exc.value!r}) "
                                f"(from {where})")
            else:  # a section given as a scalar: OmegaConf does not say which
                key = _scalar_section(OmegaConf.to_container(update, resolve=False))
                if key:
                    value = OmegaConf.select(update, key)
                    problems.append(f"{key}: expected a mapping, got {_kind(value)} ({value!r}) (from {where})")
                else:
                    problems.append(f"{where}: {str(exc).splitlines()[0]}")
            if not key or not _drop(update, key):
                return target
            continue
        assert isinstance(merged, DictConfig)
        raw = OmegaConf.to_container(update, resolve=False)
        problems += _coercions(raw, OmegaConf.to_container(merged, resolve=False), "", where)
        return merged
    raise ConfigError(f"{where}: too many refused keys")


# --------------------------------------------------------------------------- building
def _values(cls: type, data: Mapping[str, Any], key: str, problems: list[str]) -> tuple[dict[str, Any], bool]:
    """The keyword arguments of `cls` from plain `data`, its sections built, and whether all of them were."""
    hints = typing.get_type_hints(cls)
    values: dict[str, Any] = {}
    built = True
    for f in dataclasses.fields(cls):
        hint, value = hints[f.name], data[f.name]
        if dataclasses.is_dataclass(hint):
            value = _build(hint, value, f"{key}.{f.name}" if key else f.name, problems)
            built = built and value is not None
        values[f.name] = value
    return values, built


def _build(cls: type, data: Mapping[str, Any], key: str, problems: list[str]) -> Any:
    """The section `cls` at `key`; None when its own rules across knobs (`__post_init__`) refuse it.

    Sections are plain records (their knobs are checked by the root), so one with a bad knob is still
    built and the root's rules across keys can be checked as well. OmegaConf.to_object would stop at
    the first `__post_init__` that raises; this goes on, so one load reports every problem.
    """
    values, built = _values(cls, data, key, problems)
    if not built:
        return None
    try:
        return cls(**values)
    except (ValueError, TypeError) as exc:
        section, sep, rest = str(exc).partition(": ")
        problems.append(f"{key}.{section}: {rest}" if sep and section in values else f"{key}: {exc}")
    return None


# Resolvers a recipe may not use: `oc.env` reads any environment variable (a secret's value would land in the
# run directory's name, config.yaml and the wandb run), `oc.decode` can build such an interpolation from parts.
_ENV_RESOLVERS = re.compile(r"\boc\s*\.\s*(env|decode)\b")


def _leaves(tree: Any, key: str = "") -> Iterable[tuple[str, Any]]:
    if isinstance(tree, dict):
        for k, v in tree.items():
            yield from _leaves(v, f"{key}.{k}" if key else str(k))
    elif isinstance(tree, list):
        for i, v in enumerate(tree):
            yield from _leaves(v, f"{key}[{i}]")
    else:
        yield key, tree


def _secret_problems(unresolved: Any, resolved: Any) -> list[str]:
    """Keys that read the environment (`oc.env`, `oc.decode`), or whose resolved value holds a secret's value
    (``seal.redact``: what the project knows as secrets), wherever they were set."""
    from seal.redact import scrub

    problems = [f"{key}: {value!r} reads the environment; recipes may not (it would put a variable's value, a "
                "secret's too, into the run's name, config.yaml and wandb): write the value itself"
                for key, value in _leaves(unresolved) if isinstance(value, str) and _ENV_RESOLVERS.search(value)]
    return problems + [f"{key}: its value holds a secret's value ({scrub(value)}); refused: it would be written "
                       "to the run directory and wandb" for key, value in _leaves(resolved)
                       if isinstance(value, str) and scrub(value) != value]


def _to_recipe(cfg: DictConfig, problems: list[str]) -> Recipe:
    unresolved = OmegaConf.to_container(cfg, resolve=False)
    secret = _secret_problems(unresolved, {})
    if secret:  # refused before resolving: resolving would read the variables
        raise ConfigError.listing([*problems, *secret])
    try:
        OmegaConf.resolve(cfg)
    except OmegaConfBaseException as exc:
        raise ConfigError.listing([*problems, f"cannot resolve interpolations: {str(exc).splitlines()[0]}"]) from exc
    data = OmegaConf.to_container(cfg, resolve=True)
    assert isinstance(data, dict)
    problems += _secret_problems({}, data)
    problems += knob_problems(Recipe, data)  # every knob of the tree, at once
    values, built = _values(Recipe, data, "", problems)
    if built and not problems:
        return Recipe(**values)  # raises ConfigError listing the broken rules across keys
    # The root's rules across keys, reported with the problems found so far; a rule that reads a section
    # which could not be built is skipped.
    with contextlib.suppress(AttributeError):
        problems += Recipe.check(SimpleNamespace(**values))  # type: ignore[arg-type]
    raise ConfigError.listing(problems)


def load_config(path: str | Path | None = None, overrides: Sequence[str] = ()) -> Recipe:
    """Compose the recipe at `path` (+ its defaults list) + `overrides` over the schema, resolve
    interpolations and build the `Recipe`. `path=None` loads the embedded default (`exp/tiny_cpu.yaml`).

    A relative `path` follows the input-path rule (`seal.io_utils.input_path`): from the cwd when it exists
    there, else from the project. Raises `ConfigError` listing every unknown key, wrong type, value out of
    range, unknown enum value and broken cross-key rule.
    """
    recipe = input_path(path) if path is not None else DEFAULT_RECIPE
    if not recipe.is_file():
        where = "" if Path(str(path)).expanduser().is_absolute() else " (looked in the cwd, then the project)"
        raise ConfigError(f"recipe not found: {path}{where}")
    problems: list[str] = []
    cfg = _merge(schema(), _compose_file(recipe, ()), f"recipe {recipe.name}", problems)
    cfg = _merge(cfg, parse_overrides(keep_string_words(overrides, cfg)), "overrides", problems)
    return _to_recipe(cfg, problems)


def from_container(data: Recipe | Mapping[str, Any] | DictConfig) -> Recipe:
    """The `Recipe` of a plain mapping with every key (a saved `config.yaml`, the recipe inside a verl
    config), checked like a loaded recipe. A `Recipe` is returned as it is."""
    if isinstance(data, Recipe):
        return data
    if not isinstance(data, (Mapping, DictConfig)):
        raise ConfigError(f"a recipe must be a mapping, got {type(data).__name__}")
    problems: list[str] = []
    cfg = _merge(schema(), OmegaConf.create(to_container(data)), "config", problems)
    return _to_recipe(cfg, problems)


def validate(data: Recipe | Mapping[str, Any] | DictConfig) -> None:
    """Raise `ConfigError` unless `data` is a valid recipe (see `from_container`)."""
    from_container(data)


def to_container(cfg: Recipe | Mapping[str, Any] | DictConfig) -> dict[str, Any]:
    """Plain (resolved) dicts and lists."""
    if isinstance(cfg, Recipe):
        node: Any = OmegaConf.structured(cfg)
    elif isinstance(cfg, DictConfig):
        node = cfg
    else:
        node = OmegaConf.create(dict(cfg))
    out = OmegaConf.to_container(node, resolve=True)
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


# --------------------------------------------------------------------------- input paths
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
    model = dataclasses.replace(
        cfg.model, path=model_path_value(cfg.model.path, cfg.model.build_tiny),
        warm_start=dataclasses.replace(cfg.model.warm_start, path=str(input_path(cfg.model.warm_start.path))))
    data = dataclasses.replace(cfg.data, **{key: str(path) for key, path in files.items()})
    return dataclasses.replace(cfg, data=data, model=model)


def model_dir(cfg: Recipe) -> str:
    """The model directory a run loads: a built-in model's cached build (built when missing); with
    `model.build_tiny` the tiny random Qwen2, built first when missing (only inside the model cache,
    `seal.models.tiny.prepare_tiny_model`); a local directory, absolute; else a hub id as given."""
    if is_builtin(cfg.model.path):
        return str(builtin_model(cfg.model.path))
    if cfg.model.build_tiny:
        from seal.models.tiny import prepare_tiny_model

        # hidden, layers, seed, heads, kv_heads
        return str(prepare_tiny_model(input_path(cfg.model.path), **vars(cfg.model.tiny)))
    return model_path_value(cfg.model.path, build_tiny=False)

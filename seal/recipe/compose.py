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
at once, each naming its key.

`load_config` returns the `Recipe` dataclass itself rather than a structured `DictConfig`: the
engines and the controller then read plain typed attributes (`cfg.rollout.n` is an `int` to a type
checker, too, so no casts), the object is frozen (nothing changes the run's config after it was
saved), and building it runs every range and cross-key check (`Recipe.__post_init__`), so an
invalid recipe cannot exist. `to_container` / `save_config` turn it back into plain YAML.

Explicit zeros stay zeros everywhere: nothing here reads a value with `value or default`.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from omegaconf import DictConfig, ListConfig, OmegaConf
from omegaconf.errors import ConfigKeyError, OmegaConfBaseException
from omegaconf.nodes import AnyNode, BooleanNode, FloatNode, IntegerNode, StringNode

from seal.core.config_parsing import knob_problems
from seal.recipe.schema import ConfigError, Recipe
from seal.recipe.spelling import did_you_mean, dotted_keys, keep_string_words

REPO_ROOT = Path(__file__).resolve().parents[2]
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
    """`OmegaConf.structured(Recipe)`, writable (the frozen dataclasses would make it read-only)."""
    cfg = OmegaConf.structured(Recipe)

    def writable(node: DictConfig) -> None:
        OmegaConf.set_readonly(node, None)
        for key in node:
            child = node._get_node(key)
            if isinstance(child, DictConfig):
                writable(child)

    writable(cfg)
    return cfg


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    for kind in (bool, int, float, str, list, dict):
        if isinstance(value, kind):
            return kind.__name__
    return type(value).__name__


_NODE_KINDS = {BooleanNode: "bool", IntegerNode: "int", FloatNode: "float", StringNode: "str", AnyNode: "any"}


def _expected(target: DictConfig, key: str) -> str:
    """What the schema accepts at dotted `key` (for a type error's message)."""
    node: Any = target
    for part in key.split("."):
        if isinstance(node, DictConfig) and part in node:
            node = node._get_node(part)
        elif isinstance(node, DictConfig):  # a new key of an open mapping: its element type
            element = node._metadata.element_type
            return getattr(element, "__name__", str(element))
        else:
            return "?"
    if isinstance(node, DictConfig):
        kind = "mapping"
    elif isinstance(node, ListConfig):
        kind = "list"
    else:
        kind = _NODE_KINDS.get(type(node), type(node).__name__)
    return f"{kind} or null" if node._is_optional() and kind != "any" else kind


def _drop(cfg: DictConfig, key: str) -> bool:
    """Remove dotted `key` from `cfg`; False when it is not there."""
    *parents, last = key.split(".")
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


def _scalar_section(target: DictConfig, raw: Any, prefix: str) -> str:
    """The first key where `raw` holds a non-mapping and the schema a section ("" if none)."""
    if not isinstance(raw, dict):
        return ""
    for k, v in raw.items():
        if k not in target:
            continue
        key = f"{prefix}.{k}" if prefix else str(k)
        node = target._get_node(k)
        if isinstance(node, DictConfig) and dataclasses.is_dataclass(OmegaConf.get_type(node)):
            if not isinstance(v, dict):
                return key
            found = _scalar_section(node, v, key)
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
            key = str(getattr(exc, "full_key", "") or "")
            if isinstance(exc, ConfigKeyError):
                hint = _VOCABULARY_HINT if key.endswith(".vocabulary") else "every key is listed in docs/config.md"
                problems.append(f"{key}: unknown key {key!r}{did_you_mean(key, dotted_keys(target))} "
                                f"(from {where}; {hint})")
            elif key:
                value = getattr(exc, "value", None)
                problems.append(f"{key}: expected {_expected(target, key)}, got {_kind(value)} ({value!r}) "
                                f"(from {where})")
            else:  # a section given as a scalar: OmegaConf does not say which
                key = _scalar_section(target, OmegaConf.to_container(update, resolve=False), "")
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
def _build(node: DictConfig, key: str, problems: list[str]) -> tuple[Any, bool]:
    """The dataclass object of a merged structured `node` and whether it is valid (`problems` say why not).

    OmegaConf.to_object would stop at the first `__post_init__` that raises; this goes on through the
    other sections so one load reports every problem, each under its key. A section with a bad knob is
    still built when it can be (so the root's cross-key rules can be checked), but counts as invalid.
    """
    cls = OmegaConf.get_type(node)
    assert cls is not None and dataclasses.is_dataclass(cls)
    values: dict[str, Any] = {}
    valid = True
    unbuilt = False  # a section that could not be built at all
    for f in dataclasses.fields(cls):
        child = node._get_node(f.name)
        sub = f"{key}.{f.name}" if key else f.name
        if isinstance(child, DictConfig) and dataclasses.is_dataclass(OmegaConf.get_type(child)):
            values[f.name], ok = _build(child, sub, problems)
            valid = valid and ok
            unbuilt = unbuilt or values[f.name] is None
        elif isinstance(child, (DictConfig, ListConfig)):
            values[f.name] = OmegaConf.to_container(child, resolve=True)
        else:
            values[f.name] = node[f.name]
    if cls is Recipe and not valid:
        # The root cannot be built, but its cross-key rules may still be checked on the sections.
        with contextlib.suppress(AttributeError, TypeError):  # a rule reads a section that could not be built
            problems += Recipe.check(SimpleNamespace(**values))  # type: ignore[arg-type]
        return None, False
    own = knob_problems(cls, values, key) if cls is not Recipe else []  # the root checks itself
    problems += own
    if unbuilt:
        return None, False
    try:
        return cls(**values), valid and not own
    except ConfigError as exc:
        problems += exc.problems
    except (ValueError, TypeError) as exc:
        section, sep, rest = str(exc).partition(": ")
        named = sep and section in {f.name for f in dataclasses.fields(cls)}
        problems.append(f"{key}.{section}: {rest}" if named else f"{key}: {exc}")
    return None, False


def _to_recipe(cfg: DictConfig, problems: list[str]) -> Recipe:
    try:
        OmegaConf.resolve(cfg)
    except OmegaConfBaseException as exc:
        raise ConfigError.listing([*problems, f"cannot resolve interpolations: {str(exc).splitlines()[0]}"]) from exc
    recipe, valid = _build(cfg, "", problems)
    if problems or not valid or recipe is None:
        raise ConfigError.listing(problems or ["invalid config"])
    return recipe


def load_config(path: str | Path | None = None, overrides: Sequence[str] = ()) -> Recipe:
    """Compose the recipe at `path` (+ its defaults list) + `overrides` over the schema, resolve
    interpolations and build the `Recipe`. `path=None` loads the embedded default (`exp/tiny_cpu.yaml`).

    Raises `ConfigError` listing every unknown key, wrong type, value out of range, unknown enum value
    and broken cross-key rule.
    """
    recipe = Path(path) if path is not None else DEFAULT_RECIPE
    if not recipe.is_file():
        raise ConfigError(f"recipe not found: {recipe}")
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

"""A refused recipe's problems as the user reads them: one line per problem, each naming its dotted key.

pydantic reports every problem of a recipe at once (`ValidationError.errors()`); this turns each into our wording:
an unknown key with a "did you mean", a wrong type or a value outside its rule with the value and the key's help,
a rule of a section's or of the recipe's validator as written there, prefixed with the section's key. pydantic runs
a section's cross-key rules only once its own keys are valid, and the recipe's only once every section is: a
recipe with key problems says that its cross-key rules wait for them.
"""

from __future__ import annotations

import re
import types
import typing
from collections.abc import Iterable, Mapping
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ValidationError
from pydantic.fields import FieldInfo

from seal.recipe.spelling import did_you_mean, dotted_keys

# Said for a `vocabulary` key anywhere else: A-Patch and interface evolution have none of their own.
VOCABULARY_HINT = "the vocabulary is chosen once, by seal.diagnosis.vocabulary"
WAITING = "(rules across keys are checked once the problems above are fixed)"


def type_name(hint: Any) -> str:
    """A key's type as the reference writes it: `int | null`, `list[str]` (a value set's type is its values')."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is Annotated:
        return type_name(args[0])
    if origin is Literal:
        return type(args[0]).__name__
    if origin in (typing.Union, types.UnionType):
        names = list(dict.fromkeys(type_name(a) for a in args if a is not type(None)))
        return " | ".join(names) + (" | null" if type(None) in args else "")
    if origin in (list, tuple):
        return f"list[{type_name(args[0])}]"
    if origin is dict:
        return f"dict[{type_name(args[0])}, {type_name(args[1])}]"
    return getattr(hint, "__name__", str(hint))


def _bounds(metadata: list[Any]) -> str:
    """pydantic's range rules (`ge`, `gt`, `le`, `min_length`) as text: `[a, b]`, `(a, b]`, `>= a`, `> a`, `<= b`."""
    rule = {k: getattr(m, k) for m in metadata for k in ("ge", "gt", "le", "min_length") if hasattr(m, k)}
    if rule.get("min_length") == 1:
        return "not empty"
    low = f"({rule['gt']}" if "gt" in rule else f"[{rule['ge']}" if "ge" in rule else None
    high = f"{rule['le']}]" if "le" in rule else None
    if low and high:
        return f"{low}, {high}"
    if low:
        return f"{'>' if 'gt' in rule else '>='} {low[1:]}"
    return f"<= {high[:-1]}" if high else ""


def allowed(hint: Any, metadata: list[Any]) -> str:
    """The values a key's type and rules allow, as the reference shows them ("" when any value of its type goes)."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is Annotated:
        inner = [m for a in args[1:] for m in (a.metadata if isinstance(a, FieldInfo) else [a])]
        return allowed(args[0], [*inner, *metadata])
    if origin is Literal:
        return "one of " + ", ".join(str(a) for a in args)
    if origin in (typing.Union, types.UnionType):
        # a one-value member is a switch beside the range, the value that turns the key off (`top_k: -1`)
        texts = [t for t in (f"{typing.get_args(a)[0]} (off)" if typing.get_origin(a) is Literal
                             and len(typing.get_args(a)) == 1 else allowed(a, []) for a in args if a is not type(None))
                 if t]
        return " or ".join([*filter(None, [_bounds(metadata)]), *texts])
    if origin in (list, tuple, dict):
        item = allowed(args[-1] if origin is dict else args[0], [])
        return f"each {item}" if item else ""
    return _bounds(metadata)


def locate(root: type[BaseModel], loc: tuple[int | str, ...]) -> tuple[str, FieldInfo | None, type[BaseModel] | None,
                                                                     bool]:
    """The dotted key of pydantic's `loc` (`rollout.n`, `env.urls[0]`, `seal.apatch.tag_weights.pass`), the field
    it names (None for a section or an unknown key), the section model it names (None for a leaf) and whether it
    names an item of the field. pydantic's own steps (a union member such as `literal[-1]`) are left out."""
    key, model, info, mapping, item = "", root, None, False, False
    for part in loc:
        if isinstance(part, int):
            key, item = f"{key}[{part}]", True
        elif model is not None:
            info = model.model_fields.get(part)
            key = f"{key}.{part}" if key else str(part)
            hint = info.annotation if info is not None else None
            model = hint if isinstance(hint, type) and issubclass(hint, BaseModel) else None
            mapping = typing.get_origin(hint) is dict
            info = None if model is not None else info
        elif mapping:  # a key of a mapping setting (tag_weights, cue_texts)
            key, mapping, item = f"{key}.{part}", False, True
    return key, info, model, item


def _origin(key: str, origins: Mapping[str, str]) -> str:
    key = key.split("[")[0]
    while key and key not in origins:
        key = key.rpartition(".")[0]
    return f" (from {origins[key]})" if key else ""


def _kind(value: Any) -> str:
    return "null" if value is None else "mapping" if isinstance(value, dict) else type(value).__name__


def _item_type(hint: Any) -> Any:
    """The type of one item of a list, tuple or mapping type (`tuple[str, ...] | None` -> `str`)."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        return _item_type(next(a for a in args if a is not type(None)))
    return args[-1] if origin is dict else args[0] if origin in (list, tuple) else hint


def _wrong(e: Any, info: FieldInfo | None, section: type[BaseModel] | None, item: bool) -> str:
    """What the value breaks, in the reference's words (`docs/config.md`): its type, value set or range."""
    value = e["input"]
    if section is not None:
        return f"expected a mapping, got {_kind(value)} ({value!r})"
    if info is None or e["type"] == "finite_number":
        return f"{e['msg'].replace('Input should', 'must')}, got {value!r}"
    if e["type"].endswith("_type"):  # int_type, bool_type, string_type, dict_type, ...
        hint = _item_type(info.annotation) if item else info.annotation
        return f"expected {type_name(hint)}, got {_kind(value)} ({value!r})"
    rule = allowed(info.annotation, info.metadata).removeprefix("each ")
    text = f"must lie in {rule}" if rule[:1] in "[(" else f"must be {rule}"
    return f"{text}, got {value!r} ({info.description})"


def messages(root: type[BaseModel], exc: ValidationError, known: Any, origins: Mapping[str, str]) -> list[str]:
    """Every problem of `exc` (raised validating `root`), in order; `known`: the recipe's keys (for "did you
    mean"), `origins`: which file or the overrides set each key."""
    out: list[str] = []
    seen: set[str] = set()
    waiting = False  # a key problem: the cross-key rules that read it did not run
    for e in exc.errors():
        key, info, section, item = locate(root, e["loc"])
        if e["type"] == "extra_forbidden":
            hint = VOCABULARY_HINT if key.endswith(".vocabulary") else "every key is listed in docs/config.md"
            where = _origin(key, origins).removesuffix(")").removeprefix(" (")
            waiting = True
            out.append(f"{key}: unknown key {key!r}{did_you_mean(key, list(dotted_keys(known)))} "
                       f"({where + '; ' if where else ''}{hint})")
        elif e["type"] == "value_error":  # a validator's rule; its lines name keys of the section at `key`
            fields = section.model_fields if section is not None else {}
            for line in str(e["ctx"]["error"]).splitlines():
                first = line.split(" ", 1)[0].rstrip(":")
                if key and first in fields:  # the rule names its section's keys bare: name them in full
                    named = [f for f in fields if "_" in f and f != first]  # plain words may be prose
                    line = re.sub(rf"(?<![.\w])({'|'.join(named)})\b", rf"{key}.\1", line) if named else line
                out.append(line if not key else f"{key}.{line}" if first in fields else f"{key}: {line}")
        else:
            waiting = True
            if key not in seen:  # a union (`top_k`) reports once per member: one message says the whole rule
                seen.add(key)
                out.append(f"{key}: {_wrong(e, info, section, item)}{_origin(key, origins)}")
    return [*out, WAITING] if waiting else out


def leaves(tree: Any, key: str = "") -> Iterable[tuple[str, Any]]:
    if isinstance(tree, dict):
        for k, v in tree.items():
            yield from leaves(v, f"{key}.{k}" if key else str(k))
    elif isinstance(tree, list):
        for i, v in enumerate(tree):
            yield from leaves(v, f"{key}[{i}]")
    else:
        yield key, tree


# Resolvers a recipe may not use: `oc.env` reads any environment variable (a secret's value would land in the
# run directory's name, config.yaml and the wandb run), `oc.decode` can build such an interpolation from parts.
_ENV_RESOLVERS = re.compile(r"\boc\s*\.\s*(env|decode)\b")


def secret_problems(unresolved: Any, resolved: Any) -> list[str]:
    """Keys that read the environment (`oc.env`, `oc.decode`), or whose resolved value holds a secret's value
    (``seal.redact``: what the project knows as secrets), wherever they were set."""
    from seal.redact import scrub

    problems = [f"{key}: {value!r} reads the environment; recipes may not (it would put a variable's value, a "
                "secret's too, into the run's name, config.yaml and wandb): write the value itself"
                for key, value in leaves(unresolved) if isinstance(value, str) and _ENV_RESOLVERS.search(value)]
    return problems + [f"{key}: its value holds a secret's value ({scrub(value)}); refused: it would be written "
                       "to the run directory and wandb" for key, value in leaves(resolved)
                       if isinstance(value, str) and scrub(value) != value]

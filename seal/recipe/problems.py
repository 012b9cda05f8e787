"""A refused recipe's problems as the user reads them: one line per problem, each naming its dotted key.

pydantic reports every problem of a recipe at once (`ValidationError.errors()`); this turns each into our wording:
an unknown key with a "did you mean", a wrong type or a value outside its rule with the value and the key's help,
a rule of a section's or of the recipe's validator as written there, prefixed with the section's key. pydantic runs
a section's cross-key rules only once its own keys are valid, and the recipe's only once every section is: a
recipe with key problems says that its cross-key rules wait for them.
"""

from __future__ import annotations

import types
import typing
from collections.abc import Mapping
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
        # a one-value member is a switch beside the range (`top_k: >= 1 or -1`)
        texts = [t for t in (str(typing.get_args(a)[0]) if typing.get_origin(a) is Literal and len(typing.get_args(a))
                             == 1 else allowed(a, []) for a in args if a is not type(None)) if t]
        return " or ".join([*filter(None, [_bounds(metadata)]), *texts])
    if origin in (list, tuple, dict):
        item = allowed(args[-1] if origin is dict else args[0], [])
        return f"each {item}" if item else ""
    return _bounds(metadata)


def locate(root: type[BaseModel], loc: tuple[int | str, ...]) -> tuple[str, FieldInfo | None, type[BaseModel] | None]:
    """The dotted key of pydantic's `loc` (`rollout.n`, `env.urls[0]`, `seal.apatch.tag_weights.pass`), the field
    it names (None for a section or an unknown key) and the section model it names (None for a leaf). pydantic's
    own steps (a union member such as `literal[-1]`) are left out."""
    key, model, info, mapping = "", root, None, False
    for part in loc:
        if isinstance(part, int):
            key += f"[{part}]"
        elif model is not None:
            info = model.model_fields.get(part)
            key = f"{key}.{part}" if key else str(part)
            hint = info.annotation if info is not None else None
            model = hint if isinstance(hint, type) and issubclass(hint, BaseModel) else None
            mapping = typing.get_origin(hint) is dict
            info = None if model is not None else info
        elif mapping:  # a key of a mapping setting (tag_weights, cue_texts)
            key, mapping = f"{key}.{part}", False
    return key, info, model


def _origin(key: str, origins: Mapping[str, str]) -> str:
    while key and key not in origins:
        key = key.rpartition(".")[0]
    return f" (from {origins[key]})" if key else ""


def _kind(value: Any) -> str:
    return "null" if value is None else "mapping" if isinstance(value, dict) else type(value).__name__


def _wrong(e: Any, info: FieldInfo | None, section: type[BaseModel] | None) -> str:
    """What the value breaks, in the reference's words (`docs/config.md`): its type, value set or range."""
    value = e["input"]
    if section is not None:
        return f"expected a mapping, got {_kind(value)} ({value!r})"
    if info is None or e["type"] == "finite_number":
        return f"{e['msg'].replace('Input should', 'must')}, got {value!r}"
    if e["type"].endswith("_type"):  # int_type, bool_type, string_type, dict_type, ...
        return f"expected {type_name(info.annotation)}, got {_kind(value)} ({value!r})"
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
        key, info, section = locate(root, e["loc"])
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
                out.append(line if not key else f"{key}.{line}" if first in fields else f"{key}: {line}")
        else:
            waiting = True
            if key not in seen:  # a union (`top_k`) reports once per member: one message says the whole rule
                seen.add(key)
                out.append(f"{key}: {_wrong(e, info, section)}{_origin(key, origins)}")
    return [*out, WAITING] if waiting else out

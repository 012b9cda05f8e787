#!/usr/bin/env bash
# One-command smoke test of the verl engine on one GPU node (docs/verl_engine.md, "First GPU run").
#
#   bash scripts/verl_gpu_smoke.sh                  # 4 GPUs, Qwen/Qwen2.5-0.5B-Instruct
#   NGPU=1 MODEL=/models/Qwen2.5-0.5B-Instruct bash scripts/verl_gpu_smoke.sh
#
# Needs: `pip install -e '.[gpu]'` (verl[vllm]==0.9.1), CUDA GPUs, the model (Hub id or local dir).
# Runs: an env service on $PORT, then 2 SEAL training steps (4 tasks x 4 rollouts, one per category
# first) with validation (8 tasks, greedy) at steps 0 and 2 and a checkpoint at step 2; with
# SMOKE_RESUME=1 a second run resumes from that checkpoint and trains step 3.
# Then it checks the run directory and prints "SMOKE OK" (expected output: docs/verl_engine.md).
set -euo pipefail

cd "$(dirname "$0")/.."
MODEL=${MODEL:-Qwen/Qwen2.5-0.5B-Instruct}
NGPU=${NGPU:-4}
PORT=${PORT:-8092}
RUN_ROOT=${RUN_ROOT:-runs/_smoke}
SMOKE_RESUME=${SMOKE_RESUME:-0}
RUN_DIR="$RUN_ROOT/verl_smoke"

python - "$MODEL" <<'EOF'
import importlib.util, sys
import torch
missing = [m for m in ("vllm", "verl") if importlib.util.find_spec(m) is None]
if missing or not torch.cuda.is_available():
    sys.exit(f"smoke: needs CUDA GPUs and {missing or 'verl+vllm'} (pip install -e '.[gpu]')")
print(f"smoke: {torch.cuda.device_count()} CUDA devices, torch {torch.__version__}")
# The attention backend the FSDP workers will load the model with (model.attn_implementation: auto):
# load the model's config with it now, so a missing/broken flash-attn shows here and not in a worker.
from transformers import AutoConfig
from seal.engines.verl.config import resolve_attn_implementation
attn = resolve_attn_implementation("auto")
AutoConfig.from_pretrained(sys.argv[1], attn_implementation=attn)
print(f"smoke: attention backend {attn}" + ("" if attn == "flash_attention_2" else
      " (flash_attn does not import: verl's remove-padding path runs on sdpa)"))
EOF

rm -rf "$RUN_DIR"
mkdir -p "$RUN_DIR"
python -m env_service --host 127.0.0.1 --port "$PORT" >"$RUN_DIR/env_service.log" 2>&1 &
ENV_PID=$!
trap 'kill $ENV_PID 2>/dev/null || true' EXIT
for _ in $(seq 1 120); do
  if curl -sf "http://127.0.0.1:$PORT/healthz" >/dev/null; then break; fi
  sleep 1
done
curl -sf "http://127.0.0.1:$PORT/healthz" >/dev/null || { echo "smoke: env service did not start"; exit 1; }

train() {  # $1 = total training steps, $2 = trainer.resume
  python - "$1" "$2" <<EOF
import sys
from seal.recipe import load_config
from seal.engines.verl.launch import train
steps, resume = sys.argv[1], sys.argv[2]
cfg = load_config("exp/SEAL.yaml", [
    "experiment_name=verl_smoke", "run_root=$RUN_ROOT", "model.path=$MODEL",
    "env.urls=[http://127.0.0.1:$PORT]",
    "data.train_batch_size=4", "data.max_train_tasks=8", "data.max_val_tasks=8",
    "rollout.n=4", "rollout.gpu_memory_utilization=0.5", "rollout.concurrency=64",
    "actor.ppo_mini_batch_size=2",
    f"trainer.total_training_steps={steps}", "trainer.test_freq=2", "trainer.save_freq=2",
    "trainer.n_gpus_per_node=$NGPU", "trainer.logger=[console,jsonl]", f"trainer.resume={resume}",
])
train(cfg, "$RUN_DIR", overrides=["actor_rollout_ref.rollout.agent.num_workers=4"])
EOF
}

START=$(date +%s)
train 2 disable 2>&1 | tee "$RUN_DIR/train.log"
if [ "$SMOKE_RESUME" = "1" ]; then
  train 3 auto 2>&1 | tee "$RUN_DIR/train_resume.log"
fi

python - "$RUN_DIR" "$SMOKE_RESUME" "$(( $(date +%s) - START ))" <<'EOF'
import json, sys
from pathlib import Path
run, resume, wall = Path(sys.argv[1]), sys.argv[2] == "1", int(sys.argv[3])
rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
by_step = {}
for r in rows:
    by_step.setdefault(r["step"], {}).update(r)
problems = []
def need(cond, what):
    if not cond:
        problems.append(what)
val0 = by_step.get(0, {})
need("val/accuracy/average" in val0, "no validation at step 0")
for s in (1, 2):
    m = by_step.get(s, {})
    need("train/reward_mean" in m and "apatch/enabled" in m and "actor/pg_loss" in m, f"step {s} metrics incomplete")
    need(m.get("train/num_rollouts") == 16.0, f"step {s}: expected 16 rollouts, got {m.get('train/num_rollouts')}")
need("val/accuracy/average" in by_step.get(2, {}), "no validation at step 2")
ck = run / "checkpoints"
need((ck / "step_2" / "seal_state.json").is_file(), "checkpoints/step_2/seal_state.json missing")
need((ck / "step_2" / "actor").is_dir(), "verl actor checkpoint missing")
hf = ck / "step_2" / "actor" / "huggingface"
need((hf / "config.json").is_file() and any(hf.glob("*.safetensors")),
     "actor/huggingface export (config.json + safetensors) missing at step 2")
# Rollout log-probs (vLLM, bf16) against the actor's recomputed ones: the calibrated sync rule on the mean
# |Δp| per step and its step-over-step jump, not on the max (seal/engines/verl/sync_check.py; the measured
# healthy and stale figures are there and in docs/verl_engine.md, "The sync check").
from seal.engines.verl.sync_check import sync_problems
problems += sync_problems(by_step, (1, 2, 3) if resume else (1, 2))
for s in (1, 2):
    m = by_step.get(s, {})
    # Synchronous mode: every trajectory was generated by the current weights (staleness 0).
    stale = m.get("training/off_policy/trajectory_staleness/max")
    need(stale == 0, f"step {s}: training/off_policy/trajectory_staleness/max={stale} (expected 0, sync mode)")
need(json.loads((ck / "latest.json").read_text())["step"] == (3 if resume else 2), "latest.json wrong")
need((ck / "best.json").is_file(), "best.json missing")
if resume:
    need("train/reward_mean" in by_step.get(3, {}), "resumed run did not train step 3")
for s in sorted(by_step):
    m = by_step[s]
    keys = ["val/accuracy/average", "train/reward_mean", "train/accuracy_mean", "apatch/mean_scale",
            "interface/version", "actor/pg_loss", "actor/kl_loss", "actor/grad_norm",
            "training/rollout_probs_diff_max", "training/rollout_probs_diff_mean", "rollout_corr/k3_kl",
            "training/off_policy/trajectory_staleness/max"]
    print(f"step {s}: " + ", ".join(f"{k}={m[k]:.4g}" for k in keys if isinstance(m.get(k), (int, float))))
if problems:
    print("SMOKE FAILED:\n  " + "\n  ".join(problems))
    sys.exit(1)
print(f"SMOKE OK ({wall} s): {run}")
EOF

"""What a run needs, computed from the resolved recipe and verl config (no probe here: pure arithmetic, so each
number can be checked by hand). Sizes in bytes; `GB` = 1e9 bytes, as disks are sold.

Sources, read from verl 0.9.1's code rather than assumed:
- FSDP parameters are held in `fsdp_config.model_dtype` (fp32 by default; `verl.workers.engine.fsdp`), AdamW keeps
  two states of the same dtype, gradients too. The checkpoint's `model` part is the sharded parameters, `optimizer`
  the sharded states (`verl.utils.checkpoint.fsdp_checkpoint_manager`).
- The `hf_model` part is rank 0's full state dict of those parameters (`get_fsdp_full_state_dict`, then
  `save_pretrained(state_dict=...)`): written in the FSDP parameter dtype, fp32 by default, not the model dtype.
- The resource pool: `n_gpus_per_node` bundles per node of {CPU: `ResourcePoolManager.max_colocate_count`, GPU: 1}
  (`verl.single_controller.ray.base`); TransferQueue: `num_data_storage_units` storage-unit actors and one
  controller, each `@ray.remote(num_cpus=...)` (read from the classes).
- vLLM sleeps at level 2 between rollouts (weights discarded, KV cache freed: `_resolve_sleep_level`), so nothing
  of vLLM is offloaded to host memory; while it is awake the actor's parameters and optimizer stay on the GPU unless
  offloaded (`ActorRolloutRefWorker.update_weights`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

GB = 1e9
GIB = 1 << 30
DTYPE_BYTES = {"fp32": 4, "float32": 4, "bf16": 2, "bfloat16": 2, "fp16": 2, "float16": 2}
ADAM_STATES = 2  # exp_avg, exp_avg_sq

# The published config.json of the recipes' models (architecture fields only), used when the model's own config
# cannot be read offline (a hub id not downloaded yet): the parameter count follows from it exactly.
PUBLISHED_CONFIGS: dict[str, dict[str, Any]] = {
    "Qwen/Qwen2.5-7B-Instruct": {"model_type": "qwen2", "hidden_size": 3584, "intermediate_size": 18944,
                                 "num_hidden_layers": 28, "num_attention_heads": 28, "num_key_value_heads": 4,
                                 "vocab_size": 152064, "tie_word_embeddings": False},
    "Qwen/Qwen2.5-3B-Instruct": {"model_type": "qwen2", "hidden_size": 2048, "intermediate_size": 11008,
                                 "num_hidden_layers": 36, "num_attention_heads": 16, "num_key_value_heads": 2,
                                 "vocab_size": 151936, "tie_word_embeddings": True},
    "Qwen/Qwen2.5-0.5B-Instruct": {"model_type": "qwen2", "hidden_size": 896, "intermediate_size": 4864,
                                   "num_hidden_layers": 24, "num_attention_heads": 14, "num_key_value_heads": 2,
                                   "vocab_size": 151936, "tie_word_embeddings": True},
    "Team-ACE/ToolACE-2-Llama-3.1-8B": {"model_type": "llama", "hidden_size": 4096, "intermediate_size": 14336,
                                        "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
                                        "vocab_size": 128256, "tie_word_embeddings": False},
    "builtin:smollm2": {"model_type": "llama", "hidden_size": 576, "intermediate_size": 1536,
                        "num_hidden_layers": 30, "num_attention_heads": 9, "num_key_value_heads": 3,
                        "vocab_size": 49152, "tie_word_embeddings": True},
}


@dataclass(frozen=True)
class ModelShape:
    params: int
    hidden: int
    intermediate: int
    layers: int
    vocab: int


def model_shape(config: dict[str, Any]) -> ModelShape:
    """The model's exact parameter count (the model built from its config on torch's meta device: no memory, no
    weights) and the sizes the activation estimate uses."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    fields = {k: v for k, v in config.items() if k not in ("transformers_version", "_name_or_path")}
    hf_config = AutoConfig.for_model(**fields)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(hf_config)
    params = sum(p.numel() for p in model.parameters())  # a tied embedding is one parameter, counted once
    return ModelShape(params, hf_config.hidden_size, hf_config.intermediate_size, hf_config.num_hidden_layers,
                      hf_config.vocab_size)


def dtype_bytes(name: str) -> int:
    if name not in DTYPE_BYTES:
        raise ValueError(f"dtype {name!r}: the pre-flight knows {sorted(DTYPE_BYTES)}")
    return DTYPE_BYTES[name]


def sel(verl_cfg: Any, key: str, default: Any = None) -> Any:
    from omegaconf import OmegaConf

    return OmegaConf.select(verl_cfg, key, default=default)


# ------------------------------------------------------------------------------------------------------ disk
@dataclass(frozen=True)
class SavePlan:
    full_save: int  # bytes of one full save (shards + optimizer + HF export)
    hf_export: int  # bytes of the HF export alone (what an older save keeps)
    total_saves: int
    full_kept: int
    transcripts: int
    steps: int

    @property
    def total(self) -> int:
        return self.full_kept * self.full_save + (self.total_saves - self.full_kept) * self.hf_export + self.transcripts


def saved_steps(total_steps: int, save_freq: int) -> list[int]:
    """The steps that save: every `save_freq`-th (0: none) and the last one, always."""
    steps = set(range(save_freq, total_steps + 1, save_freq)) if save_freq > 0 else set()
    return sorted(steps | {total_steps})


def transcript_bytes(steps: int) -> int:
    """An upper bound of `transcripts/step_<N>.jsonl` over the run: `TRANSCRIPTS_PER_STEP` entries a step, each two
    texts of at most `TRANSCRIPT_TEXT_CHARS` characters (4 bytes each in UTF-8 at worst) and 1 kB of fields."""
    from seal.run_dir import TRANSCRIPT_TEXT_CHARS, TRANSCRIPTS_PER_STEP

    return steps * TRANSCRIPTS_PER_STEP * (2 * TRANSCRIPT_TEXT_CHARS * 4 + 1000)


def save_plan(params: int, param_bytes: int, total_steps: int, save_freq: int, keep_full: int) -> SavePlan:
    """Disk of a run's checkpoints under the checkpoint policy at its peak (`checkpoint_policy.disk_plan`: during the
    last save, the newest `keep_full` saves, the best one and the new save in full, every older save as its HF
    export only); plus the transcripts."""
    from seal.engines.checkpoint_policy import disk_plan

    hf_export = params * param_bytes
    full = params * param_bytes + params * param_bytes * ADAM_STATES + hf_export
    saves = len(saved_steps(total_steps, save_freq))
    full_kept = int(disk_plan(saves, keep_full, full, hf_export)["full_saves_peak"])
    return SavePlan(full, hf_export, saves, full_kept, transcript_bytes(total_steps), total_steps)


# ------------------------------------------------------------------------------------------------------ CPUs
@dataclass(frozen=True)
class CpuPlan:
    pool: int  # logical CPUs of verl's resource pool on this node
    per_bundle: int
    bundles: int
    storage_units: int
    per_unit: float
    controller: float
    agent_workers: int
    loader_workers: int

    def need(self, units: int | None = None) -> float:
        n = self.storage_units if units is None else units
        return self.pool + n * self.per_unit + self.controller

    def units_that_fit(self, have: float) -> int:
        """The most TransferQueue storage units (at least 1) that fit `have` logical CPUs beside the rest; 0 when
        even one does not."""
        room = have - self.pool - self.controller
        return max(0, min(self.storage_units, int(room // self.per_unit))) if self.per_unit else self.storage_units


def ray_cpus_of(actor_class: Any) -> float:
    """The `num_cpus` a `@ray.remote(num_cpus=...)` class asks for (1 when it names none: Ray's default for a
    task; an actor without one holds none, which the classes read here do not rely on)."""
    options = getattr(actor_class, "_default_options", {}) or {}
    return float(options.get("num_cpus", 1))


def cpu_plan(verl_cfg: Any) -> CpuPlan:
    """Every logical CPU the run reserves in Ray on the head node, read from verl's and TransferQueue's classes.
    Agent-loop workers, vLLM servers and the TaskRunner are actors without `num_cpus`: they hold no logical CPU
    (Ray places them even when placement groups hold every CPU: measured on this project's Ray)."""
    from transfer_queue.controller import TransferQueueController
    from transfer_queue.storage.simple_storage import SimpleStorageUnit
    from verl.single_controller.ray.base import ResourcePoolManager

    per_bundle = int(ResourcePoolManager.__dataclass_fields__["max_colocate_count"].default)
    bundles = int(sel(verl_cfg, "trainer.n_gpus_per_node"))
    units = int(sel(verl_cfg, "transfer_queue.backend.SimpleStorage.num_data_storage_units"))
    return CpuPlan(pool=bundles * per_bundle, per_bundle=per_bundle, bundles=bundles, storage_units=units,
                   per_unit=ray_cpus_of(SimpleStorageUnit), controller=ray_cpus_of(TransferQueueController),
                   agent_workers=int(sel(verl_cfg, "actor_rollout_ref.rollout.agent.num_workers")),
                   loader_workers=int(sel(verl_cfg, "data.dataloader_num_workers")))


# ---------------------------------------------------------------------------------------------- GPU memory
CUDA_CONTEXT_BYTES = int(0.75 * GIB)  # one CUDA context + NCCL buffers per process (2 on each GPU): an estimate
FRAGMENTATION = 0.05  # of the card: the caching allocator's unusable rest
APPROX_BAND = 0.5  # the estimated parts (activations, logits, contexts) may be off by half either way


@dataclass(frozen=True)
class Phase:
    name: str
    exact: dict[str, int]  # parts that follow from sizes alone
    approx: dict[str, int]  # estimated parts

    def bounds(self, card: int) -> tuple[int, int]:
        """(low, high) of what the phase needs: the exact parts plus the estimate off by `APPROX_BAND` either way;
        the high end also loses `FRAGMENTATION` of the card."""
        exact, approx = sum(self.exact.values()), sum(self.approx.values())
        return (int(exact + approx * (1 - APPROX_BAND)),
                int(exact + approx * (1 + APPROX_BAND) + FRAGMENTATION * card))

    def parts(self) -> str:
        items = [f"{k} {v / GB:.1f}" for k, v in self.exact.items() if v] + \
                [f"{k} ~{v / GB:.1f}" for k, v in self.approx.items() if v]
        return " + ".join(items)


def tokens_per_pass(verl_cfg: Any, section: str, micro_key: str, dyn_key: str, max_key: str) -> int:
    """Tokens one micro batch holds: the dynamic budget when verl packs by tokens, else micro batch x the longest
    sequence (prompt + response)."""
    seq = int(sel(verl_cfg, "data.max_prompt_length")) + int(sel(verl_cfg, "data.max_response_length"))
    if sel(verl_cfg, f"{section}.{dyn_key}", False):
        return int(sel(verl_cfg, f"{section}.{max_key}"))
    return int(sel(verl_cfg, f"{section}.{micro_key}") or 1) * seq


def activation_bytes(shape: ModelShape, tokens: int, checkpointing: bool, training: bool, fused: bool) -> int:
    """Activations of one micro batch, bf16, estimated: each layer's inputs kept for recomputation (or every
    layer's working set without it), one layer's working set (~8 hidden + 3 intermediate vectors a token), and
    the logits (bf16, their fp32 copy and its log-softmax: 10 bytes a vocabulary entry; 512-token chunks with
    verl's fused kernels). Forward-only passes keep one layer."""
    layer = tokens * (8 * shape.hidden + 3 * shape.intermediate) * 2
    logit_tokens = min(tokens, 512) if fused else tokens
    logits = logit_tokens * shape.vocab * 10
    if not training:
        return layer + logits
    kept = tokens * shape.hidden * shape.layers * 2 if checkpointing else layer * shape.layers
    return kept + layer + logits


def memory_plan(verl_cfg: Any, shape: ModelShape, card: int, world: int) -> list[Phase]:
    """Per-GPU memory of each phase of a step on a `card`-byte GPU, FSDP over `world` GPUs."""
    ar = "actor_rollout_ref"
    actor_b = dtype_bytes(str(sel(verl_cfg, f"{ar}.actor.fsdp_config.model_dtype", "fp32")))
    ref_b = dtype_bytes(str(sel(verl_cfg, f"{ar}.ref.fsdp_config.model_dtype", "fp32")))
    p_off = bool(sel(verl_cfg, f"{ar}.actor.fsdp_config.param_offload", False))
    o_off = bool(sel(verl_cfg, f"{ar}.actor.fsdp_config.optimizer_offload", False))
    ref_off = bool(sel(verl_cfg, f"{ar}.ref.fsdp_config.param_offload", False))
    shard = shape.params * actor_b // world
    optim = 0 if o_off else shard * ADAM_STATES
    params = 0 if p_off else shard
    ref = 0 if ref_off else shape.params * ref_b // world
    ckpt = bool(sel(verl_cfg, f"{ar}.model.enable_gradient_checkpointing", True))
    fused = bool(sel(verl_cfg, f"{ar}.model.use_fused_kernels", False))
    util = float(sel(verl_cfg, f"{ar}.rollout.gpu_memory_utilization"))
    bucket = int(sel(verl_cfg, f"{ar}.rollout.checkpoint_engine.update_weights_bucket_megabytes", 0) or 0) << 20
    contexts = 2 * CUDA_CONTEXT_BYTES
    # The update runs at the recipe's micro batch whatever `actor.use_dynamic_bsz` says: verl 0.9.1 ties that switch
    # to the forward-only passes', and the adapter sends `use_dynamic_bsz: false` with every update batch
    # (seal.engines.verl.gpu_settings).
    update_tokens = int(sel(verl_cfg, f"{ar}.actor.ppo_micro_batch_size_per_gpu") or 1) * (
        int(sel(verl_cfg, "data.max_prompt_length")) + int(sel(verl_cfg, "data.max_response_length")))
    lp_tokens = max(tokens_per_pass(verl_cfg, f"{ar}.{part}", "log_prob_micro_batch_size_per_gpu",
                                    "log_prob_use_dynamic_bsz", "log_prob_max_token_len_per_gpu")
                    for part in ("rollout", "ref"))
    layer_gather = 2 * 2 * shape.params // max(shape.layers, 1)  # two layers unsharded in bf16 (prefetch)
    return [
        Phase("rollout (vLLM awake)", {"vLLM gpu_memory_utilization": int(util * card), "actor params": params,
                                       "optimizer": optim, "reference": ref, "sync bucket": bucket},
              {"CUDA contexts": contexts}),
        Phase("log-probs (actor, reference)",
              {"actor params": params, "optimizer": optim, "reference": shape.params * ref_b // world,
               "layer all-gather": layer_gather},
              {f"activations ({lp_tokens} tokens)": activation_bytes(shape, lp_tokens, ckpt, False, fused),
               "CUDA contexts": contexts}),
        Phase("update (vLLM asleep)",
              {"actor params": shard, "gradients": shard, "optimizer": shard * ADAM_STATES, "reference": ref,
               "layer all-gather": layer_gather},
              {f"activations ({update_tokens} tokens)": activation_bytes(shape, update_tokens, ckpt, True, fused),
               "CUDA contexts": contexts}),
    ]


# ------------------------------------------------------------------------------------------- host memory
PROCESS_RSS_BYTES = int(2 * GIB)  # one Ray worker importing torch/vLLM (measured ~1.5-2.5 GB on CPU): an estimate


def host_memory_plan(verl_cfg: Any, shape: ModelShape, world: int, gpus_here: int
                     ) -> tuple[dict[str, int], dict[str, int]]:
    """Host memory of this node's share of the run, (exact parts, estimated parts): the reference's parameters
    offloaded to CPU, the actor's when offloaded, rank 0's HF export (the full state dict plus the empty bf16 model
    it is saved through); and, estimated, one process per FSDP rank, vLLM server, agent-loop worker and
    TransferQueue unit, plus the TaskRunner and the env service."""
    ar = "actor_rollout_ref"
    actor_b = dtype_bytes(str(sel(verl_cfg, f"{ar}.actor.fsdp_config.model_dtype", "fp32")))
    ref_b = dtype_bytes(str(sel(verl_cfg, f"{ar}.ref.fsdp_config.model_dtype", "fp32")))
    share = gpus_here / world
    offloaded_states = ((1 if sel(verl_cfg, f"{ar}.actor.fsdp_config.param_offload", False) else 0)
                        + (ADAM_STATES if sel(verl_cfg, f"{ar}.actor.fsdp_config.optimizer_offload", False) else 0))
    exact = {
        "reference offloaded": int(shape.params * ref_b * share)
        if sel(verl_cfg, f"{ar}.ref.fsdp_config.param_offload", False) else 0,
        "actor offloaded": int(shape.params * actor_b * share * offloaded_states),
        "rank 0 HF export": shape.params * actor_b + shape.params * 2,
    }
    tp = int(sel(verl_cfg, f"{ar}.rollout.tensor_model_parallel_size", 1) or 1)
    processes = (gpus_here + math.ceil(gpus_here / tp) + int(sel(verl_cfg, f"{ar}.rollout.agent.num_workers"))
                 + int(sel(verl_cfg, "transfer_queue.backend.SimpleStorage.num_data_storage_units")) + 2)
    return exact, {f"{processes} processes (~{PROCESS_RSS_BYTES / GB:.1f} GB each)": processes * PROCESS_RSS_BYTES}

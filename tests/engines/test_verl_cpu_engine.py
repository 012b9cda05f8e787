"""verl 0.9.1's own FSDP2 engine on CPU (gloo, one rank), through `seal.engines.verl.cpu_patches.install_cpu_patches`.

The GPU recipe resolves `model.attn_implementation: auto` to sdpa when flash-attn is missing, and verl
then runs its remove-padding path (all sequences packed into one row, `position_ids` restarting per
sequence) on sdpa. If attention leaked across the packed sequences, every log-prob after the first
sequence would be wrong and PPO would train on garbage. Checked here with verl's `TrainingWorker` /
`FSDPEngineWithLMHead.infer_batch` (not a re-implementation): packed == padded == a plain Hugging Face
forward of each sequence alone. Runs in a spawned process: the process group and the CPU platform are
process-wide state.
"""

from __future__ import annotations

import multiprocessing as mp

import pytest

from env_service.process import free_port

pytest.importorskip("verl")

LENGTHS = (7, 12, 5)
# verl computes in bf16 unless told otherwise (FSDP mixed precision), whatever the model dtype.
FP32_MIXED_PRECISION = {"param_dtype": "fp32", "reduce_dtype": "fp32", "buffer_dtype": "fp32"}


def _packed_vs_padded(model_dir: str, port: int, queue) -> None:  # runs in the spawned process
    import os

    os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    try:
        import torch
        from tensordict import TensorDict
        from transformers import AutoModelForCausalLM

        import seal.engines.verl.trainer  # noqa: F401  - the adapter, imported the way verl's processes do
        from seal.engines.verl.cpu_patches import install_cpu_patches

        install_cpu_patches()
        from verl.trainer.config import CheckpointConfig
        from verl.utils import tensordict_utils as tu
        from verl.workers.config import FSDPEngineConfig, FSDPOptimizerConfig, HFModelConfig, TrainingWorkerConfig
        from verl.workers.engine_workers import TrainingWorker

        model_cfg = HFModelConfig(path=model_dir, override_config={"attn_implementation": "sdpa"},
                                  use_remove_padding=True, enable_gradient_checkpointing=False)
        engine_cfg = FSDPEngineConfig(strategy="fsdp2", dtype="float32", use_torch_compile=False, forward_only=True,
                                      mixed_precision=dict(FP32_MIXED_PRECISION))
        worker = TrainingWorker(TrainingWorkerConfig(
            model_type="language_model", model_config=model_cfg, engine_config=engine_cfg,
            optimizer_config=FSDPOptimizerConfig(lr=1e-6), checkpoint_config=CheckpointConfig()))
        worker.engine.initialize()
        attn = worker.engine.module.config._attn_implementation
        shapes: list[tuple[int, ...]] = []  # the input_ids shape each model forward got (packed or padded)
        worker.engine.module.register_forward_pre_hook(
            lambda module, args, kwargs: shapes.append(tuple(kwargs["input_ids"].shape)), with_kwargs=True)

        gen = torch.Generator().manual_seed(0)
        seqs = [torch.randint(0, 5000, (n,), generator=gen) for n in LENGTHS]

        def nested(rows):
            return torch.nested.as_nested_tensor(rows, layout=torch.jagged)

        def infer(remove_padding: bool) -> list[torch.Tensor]:
            td = TensorDict({"input_ids": nested(seqs),
                             "position_ids": nested([torch.arange(n) for n in LENGTHS]),
                             "loss_mask": nested([torch.ones(n, dtype=torch.long) for n in LENGTHS])},
                            batch_size=len(LENGTHS))
            tu.assign_non_tensor(td, use_remove_padding=remove_padding, temperature=1.0,
                                 global_token_num=list(LENGTHS), micro_batch_size_per_gpu=len(LENGTHS),
                                 use_dynamic_bsz=False, compute_loss=False)
            shapes.clear()
            out = worker.infer_batch(td)["log_probs"]
            seen[remove_padding] = list(shapes)
            return [row[: n - 1] for row, n in zip(out.unbind(), LENGTHS, strict=True)]  # last: no next token

        seen: dict[bool, list] = {}
        packed, padded = infer(True), infer(False)
        hf = AutoModelForCausalLM.from_pretrained(model_dir, attn_implementation="sdpa", dtype=torch.float32).eval()
        alone = []
        with torch.no_grad():
            for ids in seqs:
                logp = torch.log_softmax(hf(ids[None]).logits[0, :-1].float(), -1)
                alone.append(logp.gather(-1, ids[1:, None])[:, 0])
        queue.put({"attn": attn, "shapes": seen, "packed": [t.tolist() for t in packed],
                   "padded": [t.tolist() for t in padded], "alone": [t.tolist() for t in alone]})
        torch.distributed.destroy_process_group()
    except BaseException as exc:  # report, do not hang the parent
        import traceback

        queue.put({"error": f"{exc!r}\n{traceback.format_exc()}"})


@pytest.mark.slow  # verl's FSDP2 engine in a spawned process
def test_remove_padding_forward_under_sdpa_matches_unpacked(tmp_path):
    import torch

    from seal.models.tiny import build_tiny_qwen2

    model_dir = build_tiny_qwen2(tmp_path / "tiny", hidden=64, layers=2)
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    proc = ctx.Process(target=_packed_vs_padded, args=(str(model_dir), free_port(), queue))
    proc.start()
    try:
        result = queue.get(timeout=240)
    finally:
        proc.join(timeout=30)
        if proc.is_alive():
            proc.kill()
    assert "error" not in result, result.get("error")
    assert result["attn"] == "sdpa"
    # verl really packed: one row of all tokens, against one padded row per sequence.
    assert result["shapes"][True] == [(1, sum(LENGTHS))]
    assert result["shapes"][False] == [(len(LENGTHS), max(LENGTHS))]
    for packed, padded, alone in zip(result["packed"], result["padded"], result["alone"], strict=True):
        packed, padded, alone = map(torch.tensor, (packed, padded, alone))
        assert packed.shape == alone.shape
        torch.testing.assert_close(packed, alone, atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(padded, alone, atol=1e-4, rtol=1e-4)
    # Not vacuous: the sequences' log-probs differ from each other (a random model is not uniform).
    assert abs(result["alone"][1][0] - result["alone"][1][-1]) > 1e-6

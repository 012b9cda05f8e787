"""verl 0.9.1's own FSDP2 engine on CPU (gloo, one rank), through `seal.engines.verl.cpu_patches.install_cpu_patches`.

The GPU recipe resolves `model.attn_implementation: auto` to sdpa when flash-attn is missing, and verl
then runs its remove-padding path (all sequences packed into one row, `position_ids` restarting per
sequence) on sdpa. If attention leaked across the packed sequences, every log-prob after the first
sequence would be wrong and PPO would train on garbage. Checked here with verl's `TrainingWorker` /
`FSDPEngineWithLMHead.infer_batch` (not a re-implementation): packed == padded == a plain Hugging Face
forward of each sequence alone.

The CPU path's LM head on the response rows alone (`seal.engines.verl.head_rows`): verl's engine with the torch
fused kernel (the CPU recipe's) marks the labels with the response rows, the kernel computes those alone, and the
response's log-probs and entropies are the ones verl's own kernel gives over every row.

The GPU path's dynamic batches for the forward-only passes (`seal.engines.verl.gpu_settings`): verl's actor
engine configured as `ActorRolloutRefWorker.init_model` configures it from our GPU settings (dynamic batches on,
the forward token budget) gives the same log-probs and entropies as the micro-batch-1 path, in fewer forward
calls; and an update batch carrying `use_dynamic_bsz: false` (what the adapter's `_update_actor` sends) runs
one sequence per micro-batch although the engine's switch is on.

Each test runs in a spawned process: the process group and the CPU platform are process-wide state. Neither
needs vLLM.
"""

from __future__ import annotations

import multiprocessing as mp

import pytest

from env_service.process import free_port

pytest.importorskip("verl")

LENGTHS = (7, 12, 5)
# verl computes in bf16 unless told otherwise (FSDP mixed precision), whatever the model dtype.
FP32_MIXED_PRECISION = {"param_dtype": "fp32", "reduce_dtype": "fp32", "buffer_dtype": "fp32"}


def _training_worker(model_dir: str, port: int, model: dict | None = None, **engine: object):
    """verl's `TrainingWorker` (FSDP2 engine, fp32, sdpa, remove-padding, `model` over the model config) on one
    gloo rank, with the CPU patches; returns it and the list the input_ids shape of every model forward is
    appended to (packed or padded)."""
    import os

    os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    import seal.engines.verl.trainer  # noqa: F401  - the adapter, imported the way verl's processes do
    from seal.engines.verl.cpu_patches import install_cpu_patches

    install_cpu_patches()
    from verl.trainer.config import CheckpointConfig
    from verl.workers.config import FSDPEngineConfig, FSDPOptimizerConfig, HFModelConfig, TrainingWorkerConfig
    from verl.workers.engine_workers import TrainingWorker

    model_cfg = HFModelConfig(path=model_dir, override_config={"attn_implementation": "sdpa"},
                              use_remove_padding=True, enable_gradient_checkpointing=False, **(model or {}))
    engine_cfg = FSDPEngineConfig(strategy="fsdp2", dtype="float32", use_torch_compile=False,
                                  mixed_precision=dict(FP32_MIXED_PRECISION), **engine)
    worker = TrainingWorker(TrainingWorkerConfig(
        model_type="language_model", model_config=model_cfg, engine_config=engine_cfg,
        optimizer_config=FSDPOptimizerConfig(lr=1e-6), checkpoint_config=CheckpointConfig()))
    worker.engine.initialize()
    shapes: list[tuple[int, ...]] = []
    worker.engine.module.register_forward_pre_hook(
        lambda module, args, kwargs: shapes.append(tuple(kwargs["input_ids"].shape)), with_kwargs=True)
    return worker, shapes


def _nested(rows):
    import torch

    return torch.nested.as_nested_tensor(rows, layout=torch.jagged)


def _sequences(lengths) -> dict:
    """Random token sequences of `lengths` as verl's no-padding fields (input_ids, position_ids, loss_mask)."""
    import torch

    gen = torch.Generator().manual_seed(0)
    seqs = [torch.randint(0, 5000, (n,), generator=gen) for n in lengths]
    return {"input_ids": _nested(seqs), "position_ids": _nested([torch.arange(n) for n in lengths]),
            "loss_mask": _nested([torch.ones(n, dtype=torch.long) for n in lengths])}


def _packed_vs_padded(model_dir: str, port: int) -> dict:  # runs in the spawned process (`_spawned`)
    import torch
    from tensordict import TensorDict
    from transformers import AutoModelForCausalLM
    from verl.utils import tensordict_utils as tu

    worker, shapes = _training_worker(model_dir, port, forward_only=True)
    attn = worker.engine.module.config._attn_implementation
    fields = _sequences(LENGTHS)
    seqs = list(fields["input_ids"].unbind())

    def infer(remove_padding: bool) -> list[torch.Tensor]:
        td = TensorDict(dict(fields), batch_size=len(LENGTHS))
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
    return {"attn": attn, "shapes": seen, "packed": [t.tolist() for t in packed],
            "padded": [t.tolist() for t in padded], "alone": [t.tolist() for t in alone]}


def _reporting(target, model_dir: str, port: int, queue) -> None:
    """The spawned process: `target(model_dir, port)`'s result, or its error, goes to the parent (never a hang)."""
    try:
        queue.put(target(model_dir, port))
        import torch

        torch.distributed.destroy_process_group()
    except BaseException as exc:
        import traceback

        queue.put({"error": f"{exc!r}\n{traceback.format_exc()}"})


def _spawned(target, tmp_path) -> dict:
    """Run `target(model_dir, port)` in a spawned process on a tiny Qwen2; its result, bounded in time."""
    from seal.models.tiny import build_tiny_qwen2

    model_dir = build_tiny_qwen2(tmp_path / "tiny", hidden=64, layers=2)
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    proc = ctx.Process(target=_reporting, args=(target, str(model_dir), free_port(), queue))
    proc.start()
    try:
        result = queue.get(timeout=240)  # the verl engine's start and a few forwards of a 2-layer model
    finally:
        proc.join(timeout=30)
        if proc.is_alive():
            proc.kill()
    assert "error" not in result, result.get("error")
    return result


@pytest.mark.slow  # verl's FSDP2 engine in a spawned process
def test_remove_padding_forward_under_sdpa_matches_unpacked(tmp_path):
    import torch

    result = _spawned(_packed_vs_padded, tmp_path)
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


# Sequences of varied lengths and a token budget that needs several forward calls for them (the GPU recipe's
# budget, 12,288 tokens, would hold them all in one call: the equality cannot depend on the budget's size).
DYNAMIC_LENGTHS = (7, 12, 5, 9, 15, 3, 11)
DYNAMIC_BUDGET = 24


def _dynamic_vs_micro_batch_1(model_dir: str, port: int) -> dict:  # runs in the spawned process (`_spawned`)
    from tensordict import TensorDict
    from verl.utils import tensordict_utils as tu

    from seal.engines.verl.config import to_verl_config
    from seal.recipe import load_config

    # The actor engine as verl's ActorRolloutRefWorker.init_model configures it from the GPU recipe's config:
    # one dynamic-batch switch (actor.use_dynamic_bsz == rollout.log_prob_use_dynamic_bsz), the forward
    # pass's budget from rollout.log_prob_max_token_len_per_gpu, the update's micro-batch from the actor's.
    gpu = to_verl_config(load_config("exp/SEAL.yaml", []), "/tmp/x").actor_rollout_ref
    assert gpu.actor.use_dynamic_bsz and gpu.rollout.log_prob_use_dynamic_bsz
    worker, shapes = _training_worker(
        model_dir, port, forward_only=False, use_dynamic_bsz=gpu.actor.use_dynamic_bsz,
        infer_max_token_len_per_gpu=DYNAMIC_BUDGET, max_token_len_per_gpu=DYNAMIC_BUDGET,
        infer_micro_batch_size_per_gpu=gpu.rollout.log_prob_micro_batch_size_per_gpu,
        micro_batch_size_per_gpu=gpu.actor.ppo_micro_batch_size_per_gpu)
    n = len(DYNAMIC_LENGTHS)

    def batch(**extra) -> TensorDict:
        td = TensorDict(_sequences(DYNAMIC_LENGTHS), batch_size=n)
        tu.assign_non_tensor(td, global_token_num=list(DYNAMIC_LENGTHS), **extra)
        return td

    def old_log_probs(**extra) -> dict:  # the trainer's old-log-prob request (its extra_info)
        shapes.clear()
        out = worker.infer_batch(batch(calculate_entropy=True, compute_loss=False, temperature=1.0, **extra))
        rows = {k: [t.tolist() for t in out[k].unbind()] for k in ("log_probs", "entropy")}
        return {"calls": list(shapes), **rows}

    result = {"dynamic": old_log_probs(), "micro_batch_1": old_log_probs(use_dynamic_bsz=False,
                                                                         micro_batch_size_per_gpu=1)}

    def loss(model_output, data, dp_group=None):  # any loss: the test counts the update's forward calls
        return -model_output["log_probs"].values().sum() / data["batch_num_tokens"], {}

    worker.set_loss_fn(loss)
    for name, extra in (("update_as_sent", {"use_dynamic_bsz": False}), ("update_engine_default", {})):
        shapes.clear()
        worker.train_mini_batch(batch(mini_batch_size=n, epochs=1, seed=0, temperature=1.0,
                                      calculate_entropy=False, **extra))
        result[name] = list(shapes)
    return result


@pytest.mark.slow  # verl's FSDP2 engine in a spawned process
def test_dynamic_forward_batches_equal_micro_batch_1(tmp_path):
    import torch

    result = _spawned(_dynamic_vs_micro_batch_1, tmp_path)
    dynamic, single = result["dynamic"], result["micro_batch_1"]
    total = sum(DYNAMIC_LENGTHS)
    # micro-batch 1: one packed row per sequence; dynamic: every call within the budget, fewer calls.
    assert single["calls"] == [(1, k) for k in DYNAMIC_LENGTHS]
    assert sum(k for _, k in dynamic["calls"]) == total and all(k <= DYNAMIC_BUDGET for _, k in dynamic["calls"])
    assert -(-total // DYNAMIC_BUDGET) <= len(dynamic["calls"]) < len(DYNAMIC_LENGTHS)
    for key in ("log_probs", "entropy"):
        for a, b, k in zip(dynamic[key], single[key], DYNAMIC_LENGTHS, strict=True):
            assert len(a) == len(b) == k  # back in the batch's order (verl restores it after packing)
            # A log-prob is that of the next token; a sequence's last position has none (verl's packed row rolls
            # the next sequence's first token in there, which depends on the packing) and is never used.
            keep = k - 1 if key == "log_probs" else k
            torch.testing.assert_close(torch.tensor(a[:keep]), torch.tensor(b[:keep]), atol=1e-5, rtol=1e-5)
    # Not vacuous: the sequences' log-probs differ (the comparison would catch a reordering).
    assert abs(dynamic["log_probs"][0][0] - dynamic["log_probs"][1][0]) > 1e-6
    # The update: with `use_dynamic_bsz: false` in the batch, one sequence per micro-batch (the recipe's 1)
    # although the engine's switch is on; without it the engine's dynamic batches would apply.
    assert result["update_as_sent"] == [(1, k) for k in DYNAMIC_LENGTHS]
    assert len(result["update_engine_default"]) < len(DYNAMIC_LENGTHS)


# --------------------------------------------------------------------------- the LM head on the response rows alone
PROMPT_LENGTHS = (4, 8, 2)  # of LENGTHS: the responses are the rest of each sequence


def _response_rows_vs_every_row(model_dir: str, port: int) -> dict:  # runs in the spawned process (`_spawned`)
    from tensordict import TensorDict
    from verl.utils import tensordict_utils as tu
    from verl.utils.experimental import torch_functional as fused

    from seal.engines.verl.head_rows import unwrapped

    worker, _ = _training_worker(model_dir, port, forward_only=True, model={
        "use_fused_kernels": True, "fused_kernel_options": {"impl_backend": "torch"}})  # the CPU recipe's
    fields = _sequences(LENGTHS)
    seqs = list(fields["input_ids"].unbind())
    fields["prompts"] = _nested([s[:p] for s, p in zip(seqs, PROMPT_LENGTHS, strict=True)])
    fields["responses"] = _nested([s[p:] for s, p in zip(seqs, PROMPT_LENGTHS, strict=True)])
    rows: list[int] = []
    chunk = fused._fused_linear_for_ppo_fwd

    def counting(hidden_states, *args, **kwargs):
        rows.append(hidden_states.shape[0])
        return chunk(hidden_states, *args, **kwargs)

    fused._fused_linear_for_ppo_fwd = counting

    def infer() -> dict:
        rows.clear()
        td = TensorDict(dict(fields), batch_size=len(LENGTHS))
        tu.assign_non_tensor(td, use_remove_padding=True, temperature=1.0, global_token_num=list(LENGTHS),
                             micro_batch_size_per_gpu=len(LENGTHS), use_dynamic_bsz=False, compute_loss=False,
                             calculate_entropy=True)
        out = worker.infer_batch(td)
        return {"rows": sum(rows), **{k: [t.tolist() for t in out[k].unbind()] for k in ("log_probs", "entropy")}}

    result = {"marked": infer()}
    fused.FusedLinearForPPO.forward = unwrapped(fused.FusedLinearForPPO.forward)  # verl's own forward
    result["every_row"] = infer()
    return result


@pytest.mark.slow  # verl's FSDP2 engine in a spawned process
def test_the_lm_head_runs_on_the_response_rows_alone_with_verls_response_log_probs(tmp_path):
    import torch

    result = _spawned(_response_rows_vs_every_row, tmp_path)
    marked, every = result["marked"], result["every_row"]
    responses = [n - p for n, p in zip(LENGTHS, PROMPT_LENGTHS, strict=True)]
    assert every["rows"] == sum(LENGTHS) and marked["rows"] == sum(responses)
    for key in ("log_probs", "entropy"):
        for a, b, n, r in zip(marked[key], every[key], LENGTHS, responses, strict=True):
            kept = slice(n - r - 1, n - 1)  # the response's positions, where verl reads them
            torch.testing.assert_close(torch.tensor(a[kept]), torch.tensor(b[kept]), rtol=1e-6, atol=1e-6)
            assert any(abs(v) > 0 for v in b[kept])  # not vacuous: real values, not two rows of zeros

"""The TransferQueue agent-loop worker path the GPU run takes, with the real TransferQueue.

verl's `AgentLoopWorkerTQ` (its class, run in this process so the scripted LLM client needs no Ray
serialisation) gets a training batch as verl's trainer builds it (a TensorDict with our feed), runs the
`seal_bfcl` agent loop against a real env service, and writes each session into a real TransferQueue
(controller and storage unit as Ray actors). Then the rows are read back with the exact fields the adapter's
`_compute_advantage` asks for, each checked to be there (TransferQueue, like the in-memory fake of
test_verl_trainer.py, leaves out a field nobody wrote without an error). The LLM client is
`tests.engines.test_verl_agent_loop.ScriptedServer`: ground-truth replay for one rollout of a task, a
refusal for the other.
"""

from __future__ import annotations

import asyncio
import uuid

import numpy as np
import pytest
import torch

pytest.importorskip("verl")
ray = pytest.importorskip("ray")

from tensordict import NonTensorStack, TensorDict  # noqa: E402

from seal.core.controller import SealController  # noqa: E402
from seal.engines.verl.adapter import ADVANTAGE_INPUTS, as_list  # noqa: E402
from seal.engines.verl.agent_loop import FEED_KEY, EpisodeFeed, close_loop_resources  # noqa: E402
from seal.engines.verl.config import AGENT_LOOP_NAME, to_verl_config  # noqa: E402
from tests.engines.test_verl_agent_loop import TASKS, ScriptedServer  # noqa: E402

N = 2  # rollout.n in the recipe fixture below


@pytest.fixture(scope="module")
def tq_cluster():
    """A private local Ray (2 logical CPUs) and TransferQueue with one storage unit; torn down after."""
    import transfer_queue as tq
    from omegaconf import OmegaConf

    ray.init(num_cpus=2, include_dashboard=False, ignore_reinit_error=False, log_to_driver=False)
    try:
        tq.init(OmegaConf.create({"backend": {"storage_backend": "SimpleStorage",
                                              "SimpleStorage": {"num_data_storage_units": 1,
                                                                "total_storage_size": 1000}}}))
        yield tq
    finally:
        try:
            tq.close()
        finally:
            ray.shutdown()


@pytest.mark.slow  # starts Ray and TransferQueue
def test_tq_worker_writes_every_field_the_advantage_step_reads(tq_cluster, service_url, tmp_path):
    from verl.trainer.ppo.v1.agent_loop_tq import AgentLoopWorkerTQ
    from verl.utils.tensordict_utils import assign_non_tensor_data

    from seal.models.qwen25 import build_qwen_tokenizer
    from seal.models.tiny import tiny_qwen2_config
    from seal.recipe import load_config

    tq = tq_cluster
    tok = build_qwen_tokenizer()
    model_dir = tmp_path / "tiny"
    hf_cfg = tiny_qwen2_config()
    hf_cfg.architectures = ["Qwen2ForCausalLM"]
    hf_cfg.save_pretrained(str(model_dir))  # the worker reads the tokenizer and config, never weights
    tok.save_pretrained(str(model_dir))

    recipe = load_config("exp/SEAL.yaml", [f"model.path={model_dir}", f"env.urls=[{service_url}]",
                                           "data.max_response_length=8192", f"rollout.n={N}"])
    verl_cfg = to_verl_config(recipe, tmp_path / "run")
    server = ScriptedServer(tok, TASKS)
    omega = SealController(recipe.seal).interface("train")
    feed = EpisodeFeed(mode="train", interface=omega, training_progress=0.0).to_json()
    uids = [uuid.uuid4().hex for _ in TASKS]
    batch = TensorDict({"dummy_tensor": torch.zeros(len(TASKS), 1, dtype=torch.uint8)}, batch_size=len(TASKS))
    for key, values in {
        "uid": uids, "index": list(TASKS), "data_source": [t.rsplit("_", 1)[0] for t in TASKS],
        "agent_name": [AGENT_LOOP_NAME] * len(TASKS),
        "extra_info": [{"task_id": t, "index": t} for t in TASKS],
        "raw_prompt": [[{"role": "user", "content": "q"}] for _ in TASKS],
        FEED_KEY: [feed] * len(TASKS),
    }.items():
        batch[key] = NonTensorStack(*values)
    assign_non_tensor_data(batch, "global_steps", 1)

    async def go():
        worker = AgentLoopWorkerTQ.__ray_actor_class__(verl_cfg, server)
        try:
            await worker.generate_sequences(batch)
            while worker.background_tasks:  # verl's fire-and-forget sessions
                await asyncio.gather(*list(worker.background_tasks))
        finally:
            await close_loop_resources()

    asyncio.run(go())

    keys = [f"{uid}_{session}_0" for uid in uids for session in range(N)]
    # The advantage step's read (seal.engines.verl.adapter.TrainerAdapter._compute_advantage), minus the
    # fields verl's trainer adds before it (old/ref log-probs, values) and rm_scores' source below.
    produced = [f for f in ADVANTAGE_INPUTS if f not in ("old_log_probs", "ref_log_prob", "values")]
    td = tq.kv_batch_get(keys=keys, partition_id="train", select_fields=produced)
    extras = as_list(tq.kv_batch_get(keys=keys, partition_id="train", select_fields=["extra_fields"])["extra_fields"])
    # TransferQueue returns the fields that exist and skips the others without an error, so the check is
    # on the keys: every field the advantage step reads was written (and a field nobody wrote is absent).
    assert set(produced) <= set(td.keys()), sorted(set(produced) - set(td.keys()))
    missing = tq.kv_batch_get(keys=keys, partition_id="train", select_fields=["old_log_probs"])
    assert "old_log_probs" not in set(missing.keys())

    padded = td.to_padded_tensor()
    assert as_list(td["uid"]) == [uid for uid in uids for _ in range(N)]
    mask = td["response_mask"]
    scores = td["rm_scores"]
    for i, ex in enumerate(extras):
        ex = dict(ex)
        n_resp = int(mask[i].numel())
        assert scores[i].numel() == n_resp == td["rollout_log_probs"][i].numel()
        # The episode reward sits on the last response token (verl's reward loop is not used).
        assert float(scores[i][-1]) == pytest.approx(float(ex["reward"]))
        assert float(scores[i][:-1].abs().sum()) == 0.0
        assert ex["task_id"] == TASKS[i // N] and ex["interface_version"] == omega["version"]
        assert ex["min_global_steps"] is not None
    # Replays of the ground truth pass, refusals do not: rewards differ inside each group. Which session
    # replays is decided by which one reaches the scripted server first, so the check is per group, not per
    # session index.
    rewards = np.array([float(dict(ex)["reward"]) for ex in extras]).reshape(len(TASKS), N)
    assert [sorted(group) for group in rewards.tolist()] == [[0.0, 1.0]] * len(TASKS), rewards
    assert padded["response_mask"].shape[0] == len(keys)

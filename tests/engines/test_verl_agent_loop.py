"""The `seal_bfcl` agent loop inside verl's own agent-loop worker, against a real env service.

verl's `AgentLoopWorker` (the machinery the Ray workers run) instantiates our registered class by
name and drives it; a scripted stand-in for verl's LLM server client returns token ids and log-probs
(replaying a task's ground truth, or plain refusals). Then the trainer's advantage step (verl GRPO +
A-Patch through the controller) runs on the `DataProto` the worker produced.
"""

from __future__ import annotations

import asyncio
import math
import uuid
from collections import defaultdict

import numpy as np
import pytest
import torch

from env_service.vocab import PROGRESS_TAGS

pytest.importorskip("verl")

from verl import DataProto  # noqa: E402
from verl.workers.rollout.replica import TokenOutput  # noqa: E402

from seal.core.apatch import trajectory_scale  # noqa: E402
from seal.core.controller import SealController  # noqa: E402
from seal.core.record import EpisodeRecord
from seal.engines.verl.agent_loop import FEED_KEY, EpisodeFeed, close_loop_resources, rollout_to_output  # noqa: E402
from seal.engines.verl.config import AGENT_LOOP_NAME, to_verl_config  # noqa: E402
from seal.engines.verl.trainer import seal_advantages  # noqa: E402
from seal.models.qwen25 import EOS_TOKEN_ID, build_qwen_tokenizer  # noqa: E402
from seal.recipe import load_config  # noqa: E402
from seal.rollout.types import Rollout  # noqa: E402
from tests.helpers import sampled_spans  # noqa: E402

# Short train tasks (4-5 model calls with the ground truth), two categories, distinct first questions.
TASKS = ["multi_turn_base_100", "multi_turn_miss_param_177"]
N = 2  # rollouts per task: the first episode of a task replays the ground truth, the second refuses
WEIGHT_STEP = 5  # the weight version the fake server reports


def fake_logprob(k: int) -> float:
    return -((k % 7) + 1) / 10.0


class ScriptedServer:
    """Stand-in for verl's `LLMServerClient`: `generate(request_id, *, prompt_ids, sampling_params)`.

    Episodes are told apart by request id (our adapter uses one per episode); the task by the first
    user question in the first prompt. Every call's token ids are recorded per request.
    """

    def __init__(self, tok, tasks):
        from env_service.tasks import ground_truth_replies, load_tasks

        self.tok = tok
        all_tasks = load_tasks()
        self.questions = {t: all_tasks[t].questions[0][:80] for t in tasks}
        self.scripts = {t: [tok.encode(x, add_special_tokens=False) + [EOS_TOKEN_ID] for x in ground_truth_replies(t)]
                        for t in tasks}
        # Refusals name their task, so every episode's sampled tokens are distinct.
        self.refusals = {t: tok.encode(f"I cannot do {t}.", add_special_tokens=False) + [EOS_TOKEN_ID]
                         for t in tasks}
        self.role: dict[str, tuple[str, str]] = {}  # request id -> (task, "replay" | "refuse")
        self.produced: dict[str, list[list[int]]] = defaultdict(list)
        self.params: list[dict] = []
        self.count: dict[str, int] = defaultdict(int)

    async def generate(self, request_id, *, prompt_ids, sampling_params, **kwargs):
        await asyncio.sleep(0)
        self.params.append(dict(sampling_params))
        if request_id not in self.role:
            text = self.tok.decode(prompt_ids)
            task = next(t for t, q in self.questions.items() if q in text)
            self.role[request_id] = (task, "replay" if self.count[task] == 0 else "refuse")
            self.count[task] += 1
        task, role = self.role[request_id]
        calls = self.produced[request_id]
        if role == "replay":
            script = self.scripts[task]
            ids = script[len(calls)] if len(calls) < len(script) else script[-1]
        else:
            ids = self.refusals[task]
        calls.append(list(ids))
        return TokenOutput(token_ids=list(ids), log_probs=[fake_logprob(k) for k in range(len(ids))],
                           stop_reason="completed",
                           extra_fields={"global_steps": WEIGHT_STEP, "min_global_steps": WEIGHT_STEP,
                                         "max_global_steps": WEIGHT_STEP})


def objects(values):
    """A 1-D object array (numpy would make a 2-D array of equal-length lists)."""
    out = np.empty(len(values), dtype=object)
    out[:] = values
    return out


@pytest.fixture(scope="module")
def tok():
    return build_qwen_tokenizer()


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory, tok):
    """config.json + tokenizer only: verl's worker loads the tokenizer and HF config, never weights."""
    from seal.models.tiny import tiny_qwen2_config

    path = tmp_path_factory.mktemp("tiny_qwen2")
    cfg = tiny_qwen2_config()
    cfg.architectures = ["Qwen2ForCausalLM"]
    cfg.save_pretrained(str(path))
    tok.save_pretrained(str(path))
    return path


@pytest.fixture(scope="module")
def recipe(model_dir, service_url):
    return load_config("exp/SEAL.yaml", [f"model.path={model_dir}", f"env.urls=[{service_url}]",
                                         "data.max_response_length=8192", "rollout.n=2"])


@pytest.fixture(scope="module")
def worker_run(recipe, tok, tmp_path_factory):
    """One batch (2 tasks x 2 rollouts, training feed with Ω_0) through verl's AgentLoopWorker."""
    from verl.experimental.agent_loop.agent_loop import AgentLoopWorker

    verl_cfg = to_verl_config(recipe, tmp_path_factory.mktemp("run"))
    server = ScriptedServer(tok, TASKS)
    controller = SealController(recipe.seal)
    omega = controller.interface("train")
    feed = EpisodeFeed(mode="train", interface=omega, training_progress=0.0).to_json()
    rows = [t for t in TASKS for _ in range(N)]
    uids = {t: uuid.uuid4().hex for t in TASKS}
    non_tensors = {
        "data_source": np.array([t.rsplit("_", 1)[0] for t in rows], dtype=object),
        "agent_name": np.array([AGENT_LOOP_NAME] * len(rows), dtype=object),
        "extra_info": np.array([{"task_id": t, "index": t} for t in rows], dtype=object),
        "index": np.array(rows, dtype=object),
        "raw_prompt": objects([[{"role": "user", "content": "q"}] for _ in rows]),
        "uid": np.array([uids[t] for t in rows], dtype=object),
        FEED_KEY: np.array([feed] * len(rows), dtype=object),
    }
    batch = DataProto.from_dict(tensors={"dummy_tensor": torch.zeros(len(rows), 1, dtype=torch.uint8)},
                                non_tensors=non_tensors, meta_info={"global_steps": 1, "validate": False})

    async def go():
        worker = AgentLoopWorker(verl_cfg, server)
        try:
            return await worker.generate_sequences(batch)
        finally:
            await close_loop_resources()

    out = asyncio.run(go())
    return {"out": out, "server": server, "omega": omega, "verl_cfg": verl_cfg, "rows": rows,
            "controller": controller}


@pytest.mark.slow  # verl's agent-loop worker playing episodes against the env service (the module fixture)
def test_worker_outputs_are_token_exact_and_carry_the_diagnosis(worker_run, tok):
    out, server = worker_run["out"], worker_run["server"]
    assert len(out) == len(worker_run["rows"]) == 4
    b, nt = out.batch, out.non_tensor_batch
    unmatched = {rid for rid in server.produced}
    for i in range(len(out)):
        resp_len = int(b["attention_mask"][i, b["prompts"].shape[1]:].sum())
        ids = b["responses"][i, :resp_len].tolist()
        mask = b["response_mask"][i, :resp_len].tolist()
        assert b["response_mask"][i, resp_len:].sum() == 0
        sampled = sampled_spans(ids, mask)
        # The sampled spans are exactly the tokens one scripted episode produced, in order.
        match = [rid for rid in unmatched if server.produced[rid] == sampled]
        assert len(match) == 1, f"row {i}: sampled spans match {len(match)} episodes"
        rid = match[0]
        unmatched.discard(rid)
        task, role = server.role[rid]
        assert nt["task_id"][i] == task
        # Log-probs: the server's, on sampled tokens; 0 on observation tokens.
        lp = b["rollout_log_probs"][i, :resp_len].tolist()
        expected = [fake_logprob(k) for span in sampled for k in range(len(span))]
        assert [x for x, m in zip(lp, mask, strict=True) if m] == pytest.approx(expected)
        assert all(x == 0.0 for x, m in zip(lp, mask, strict=True) if not m)
        # Observation tokens are template + env text, never model text.
        obs_text = tok.decode([t for t, m in zip(ids, mask, strict=True) if not m])
        assert "<|im_start|>user" in obs_text
        # Reward on the last response token = the official verdict; extras carry the diagnosis.
        assert float(b["rm_scores"][i, resp_len - 1]) == nt["accuracy"][i]
        assert float(b["rm_scores"][i].sum()) == nt["accuracy"][i]
        tags = list(nt["failure_tags"][i])
        assert tags and set(tags) <= set(PROGRESS_TAGS)
        assert len(nt["paper_labels"][i]) == len(tags)
        if role == "replay":
            assert nt["accuracy"][i] == 1.0 and set(tags) <= {"pass", "correct_abstention"}
        else:
            assert nt["accuracy"][i] == 0.0 and set(tags) - {"pass", "correct_abstention"}
        assert nt["excluded"][i] is False or nt["excluded"][i] == 0
        assert nt["category"][i] == task.rsplit("_", 1)[0]
        assert nt["interface_version"][i] == worker_run["omega"]["version"]
        assert nt["min_global_steps"][i] == nt["max_global_steps"][i] == WEIGHT_STEP
        # verl's validation table reads reward_extra_info; the worker turns its keys into columns.
        assert nt["acc"][i] == nt["accuracy"][i] and nt["category"][i]
    assert not unmatched
    # Training sampling params reached the server, with a per-call token budget.
    assert all(p["temperature"] == 1.0 and p["max_tokens"] == 4096 and p["logprobs"] for p in server.params)


@pytest.mark.slow  # verl's agent-loop worker playing episodes against the env service (the module fixture)
def test_advantage_step_on_agent_loop_outputs(worker_run, recipe):
    """verl GRPO per task group (1 success, 1 failure: +-1/sqrt(2)) scaled by each row's A-Patch weight."""
    out = worker_run["out"]
    data = DataProto(batch=out.batch.clone(), non_tensor_batch=dict(out.non_tensor_batch))
    data.batch["token_level_rewards"] = data.batch["rm_scores"]
    extra_keys = ("task_id", "category", "failure_tags", "paper_labels", "accuracy", "reward", "excluded",
                  "progress", "interface_version")
    extras = [{k: data.non_tensor_batch[k][i] for k in extra_keys} for i in range(len(data))]
    records = [EpisodeRecord.from_dict(ex) for ex in extras]  # as the trainer reads the agent loop's extras
    controller = SealController(recipe.seal)
    controller.observe(records, step=1)
    metrics = seal_advantages(data, records, controller, 1, algorithm=worker_run["verl_cfg"].algorithm,
                              num_repeat=N)
    weights = controller.state.dynamic_weights  # the weights this step's A-Patch used
    adv, mask = data.batch["advantages"], data.batch["response_mask"]
    for i in range(len(data)):
        scale = trajectory_scale(extras[i]["failure_tags"], weights)
        sign = 1.0 if extras[i]["accuracy"] == 1.0 else -1.0
        on = mask[i].bool()
        assert torch.allclose(adv[i][on], torch.full_like(adv[i][on], sign * scale / math.sqrt(2.0)), atol=1e-4)
        assert torch.all(adv[i][~on] == 0)
    assert metrics["apatch/enabled"] == 1.0 and metrics["seal/excluded_rows"] == 0.0
    assert metrics["apatch/scaled_count"] == 4.0


def test_rollout_to_output_placeholder_and_verl_dict():
    """Excluded episodes become a one-token, mask-0, reward-0 sample verl can store and batch."""
    excluded = Rollout(task_id="multi_turn_base_3", mode="train", excluded=True, exclude_reason="infrastructure",
                       category="multi_turn_base")
    out = rollout_to_output(excluded, eos_id=EOS_TOKEN_ID, fallback_prompt_ids=[1, 2, 3],
                            global_steps={"min_global_steps": 2, "max_global_steps": 2}, need_logprobs=True)
    assert out.prompt_ids == [1, 2, 3] and out.response_ids == [EOS_TOKEN_ID] and out.response_mask == [0]
    assert out.reward_score == 0.0 and out.response_logprobs == [0.0]
    assert out.extra_fields["excluded"] is True and out.extra_fields["reward_extra_info"]["excluded"] == 1.0
    d = out.as_dict()  # what verl's TransferQueue worker stores
    assert d["rm_scores"].tolist() == [0.0] and d["response_mask"].tolist() == [0]
    assert "messages" not in d["extra_fields"]

    good = Rollout(task_id="multi_turn_base_3", mode="train", prompt_ids=[5, 6], response_ids=[7, 8, 9],
                   response_mask=[1, 0, 1], response_logprobs=[-0.5, 0.0, -0.25], reward=1.0, accuracy=1.0,
                   failure_tags=["pass"], paper_labels=["pass"], category="multi_turn_base",
                   messages=[{"role": "system", "content": "s"}, {"role": "user", "content": "u"},
                             {"role": "assistant", "content": "a"}])
    out = rollout_to_output(good, eos_id=EOS_TOKEN_ID, fallback_prompt_ids=[], need_logprobs=True,
                            global_steps={"min_global_steps": 1, "max_global_steps": 3})
    d = out.as_dict()
    assert d["prompts"].tolist() == [5, 6] and d["responses"].tolist() == [7, 8, 9]
    assert d["rm_scores"].tolist() == [0.0, 0.0, 1.0] and d["rollout_log_probs"].tolist() == [-0.5, 0.0, -0.25]
    assert out.num_turns == 3 and out.extra_fields["failure_tags"] == ["pass"]
    assert out.extra_fields["min_global_steps"] == 1 and out.extra_fields["max_global_steps"] == 3
    with pytest.raises(RuntimeError, match="log-probs"):
        rollout_to_output(Rollout(task_id="t", mode="train", prompt_ids=[1], response_ids=[2], response_mask=[1]),
                          eos_id=EOS_TOKEN_ID, fallback_prompt_ids=[], need_logprobs=True,
                          global_steps={"min_global_steps": 1, "max_global_steps": 1})


def test_episode_feed_refuses_an_interface_in_eval():
    assert EpisodeFeed.from_value(None) is None
    feed = EpisodeFeed.from_value(EpisodeFeed("train", {"version": 3}, 0.25).to_json())
    assert feed == EpisodeFeed("train", {"version": 3}, 0.25)
    with pytest.raises(ValueError, match="never get an interface"):
        EpisodeFeed("eval", {"version": 3})
    with pytest.raises(ValueError):
        EpisodeFeed("train", None, 1.5)

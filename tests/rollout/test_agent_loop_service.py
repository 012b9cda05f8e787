"""Agent loop + EnvClient against the real env service (subprocess on a free loopback port)."""

from __future__ import annotations

import asyncio

import pytest

from seal.models.qwen25 import EOS_TOKEN_ID, build_qwen_tokenizer
from seal.rollout.client import EnvClient, EnvClientError
from seal.rollout.episode import run_episode
from seal.rollout.types import Generation, RolloutLimits
from tests.helpers import sampled_spans  # noqa: E402

# Short train tasks (ground truth + one closing reply per turn: 4-5 model calls), one per category.
TASKS = ["multi_turn_base_100", "multi_turn_long_context_144", "multi_turn_miss_func_100",
         "multi_turn_miss_param_100"]


@pytest.fixture(scope="module")
def tok():
    return build_qwen_tokenizer()


def replay_model(tok, task_id):
    """A `generate` replaying the task's ground truth: one <tool_call> per call, a plain reply per turn."""
    from env_service.tasks import ground_truth_replies

    outputs = [tok.encode(t, add_special_tokens=False) + [EOS_TOKEN_ID] for t in ground_truth_replies(task_id)]
    produced: list[list[int]] = []

    async def generate(prompt_ids, params):
        ids = outputs[len(produced)] if len(produced) < len(outputs) else outputs[-1]
        produced.append(ids)
        return Generation(ids, "stop")

    return generate, produced


def test_ground_truth_replay_scores_and_stays_token_exact(service_url, tok):
    roomy = RolloutLimits(max_response_length=12288)  # keep every span (long tool outputs)

    async def go():
        async with EnvClient(service_url, backoff=0.05) as client:
            models = {t: replay_model(tok, t) for t in TASKS}
            rollouts = await asyncio.gather(*(
                run_episode(client, models[t][0], tok, t, "train", {"version": 7}, limits=roomy) for t in TASKS))
            for task_id, r in zip(TASKS, rollouts, strict=True):
                produced = models[task_id][1]
                assert not r.excluded and r.stop_reason == "done", (task_id, r.exclude_reason)
                assert r.accuracy == 1.0 and r.reward == 1.0, (task_id, r.eval_result)
                assert set(r.failure_tags) <= {"pass", "correct_abstention"} and r.category in task_id
                assert r.interface_version == 7 and r.num_model_calls == len(produced) and not r.truncated
                assert sampled_spans(r.response_ids, r.response_mask) == produced
                seq = r.prompt_ids + r.response_ids
                assert seq + tok.encode("\n") == tok.encode(tok.apply_chat_template(r.messages, tokenize=False))
                # The episode is gone from the service.
                async with EnvClient(service_url) as fresh:
                    with pytest.raises(EnvClientError) as info:
                        await fresh.evaluate(r.episode_id)
                    assert info.value.status == 404
            assert client.live_episodes() == {service_url: 0}

    asyncio.run(go())


def test_plain_answers_fail_with_diagnosis(service_url, tok):
    reply = tok.encode("I am not able to do that.", add_special_tokens=False) + [EOS_TOKEN_ID]

    async def generate(prompt_ids, params):
        return Generation(reply, "stop")

    async def go():
        async with EnvClient(service_url) as client:
            return await run_episode(client, generate, tok, "multi_turn_base_100", "eval")

    r = asyncio.run(go())
    assert not r.excluded and r.accuracy == 0.0 and r.reward == 0.0
    assert r.num_model_calls == r.num_turns == len(r.failure_tags)  # one plain reply ends each turn
    assert "pass" not in r.failure_tags and len(r.paper_labels) == r.num_turns
    assert sum(r.response_mask) == len(reply) * r.num_model_calls

"""Agent loop: token-exact sequences and masks, limits, retries/exclusion, batching (scripted env + model)."""

from __future__ import annotations

import asyncio
import itertools

import pytest

from seal.models.qwen25 import EOS_TOKEN_ID, build_qwen_tokenizer
from seal.rollout.client import EnvClientError, EnvProtocolError, EnvUnavailable
from seal.rollout.codec import ChatCodec
from seal.rollout.episode import OBS_TRUNCATION_MARKER, EpisodeRequest, run_batch, run_episode
from seal.rollout.types import Generation, RolloutLimits
from tests.rollout.scripted import SYSTEM, USER, ScriptedEnv, ScriptedModel


@pytest.fixture(scope="module")
def tok():
    return build_qwen_tokenizer()


@pytest.fixture(scope="module")
def codec(tok):
    # check_full_render: every increment is also checked against a full re-render of the conversation.
    return ChatCodec(tok, check_full_render=True)


def spans(values, mask, bit=1):
    """Maximal runs of `values` where mask == bit."""
    out, cur = [], []
    for v, m in zip(values, mask, strict=True):
        if m == bit:
            cur.append(v)
        elif cur:
            out.append(cur)
            cur = []
    if cur:
        out.append(cur)
    return out


def tool_call_ids(tok, name="ls", args="{}"):
    return tok.encode(f'<tool_call>\n{{"name": "{name}", "arguments": {args}}}\n</tool_call>',
                      add_special_tokens=False) + [EOS_TOKEN_ID]


def test_sampled_tokens_are_kept_exactly_and_only_they_are_trained(tok, codec):
    gens = [tool_call_ids(tok), tok.encode("There are 2 files.", add_special_tokens=False) + [EOS_TOKEN_ID],
            tok.encode("Done: ünïcode ✓", add_special_tokens=False) + [EOS_TOKEN_ID]]
    env = ScriptedEnv(["<tool_response>\na.txt\nb.txt\n</tool_response>", "Now delete them.", None])
    model = ScriptedModel(gens)
    r = asyncio.run(run_episode(env, model, codec, "multi_turn_base_1", "train", {"version": 3}))

    assert not r.excluded and not r.truncated and r.stop_reason == "done" and r.num_model_calls == 3
    head = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": USER}]
    assert r.prompt_ids == tok.encode(tok.apply_chat_template(head, tokenize=False, add_generation_prompt=True),
                                      add_special_tokens=False)
    assert len(r.response_ids) == len(r.response_mask)
    assert spans(r.response_ids, r.response_mask, 1) == gens  # trained tokens = sampled tokens, in order
    assert r.response_ids[-1] == EOS_TOKEN_ID and r.response_mask[-1] == 1
    # The model conditioned on exactly the sequence being trained.
    seq = r.prompt_ids + r.response_ids
    for prompt in model.prompts:
        assert seq[: len(prompt)] == prompt
    assert len(model.prompts[2]) == len(seq) - len(gens[2])
    # Text sent to the env: sampled tokens decoded without the eos, tool-call markup intact.
    assert [c for _, c in env.steps] == [tok.decode(g[:-1]) for g in gens]
    assert env.steps[0][1].startswith("<tool_call>\n")
    # Observation increments are the chat layout of a user turn plus the next generation prompt.
    obs_spans = spans(r.response_ids, r.response_mask, 0)
    assert tok.decode(obs_spans[1]) == "\n<|im_start|>user\nNow delete them.<|im_end|>\n<|im_start|>assistant\n"
    # Sanity check (not the mechanism): identical to templating the whole conversation.
    whole = tok.apply_chat_template(r.messages, tokenize=False)
    assert seq + tok.encode("\n", add_special_tokens=False) == tok.encode(whole, add_special_tokens=False)
    # Extras and cleanup.
    assert r.reward == 1.0 and r.failure_tags == ["pass"] and r.category == "base" and r.interface_version == 3
    assert env.deleted == env.created == ["ep0"] and env.evaluated == ["ep0"]
    extras = r.extras()
    assert extras["paper_labels"] == ["pass"] and extras["num_model_calls"] == 3 and extras["excluded"] is False


def test_length_stopped_call_is_closed_with_an_unsampled_eos(tok, codec):
    cut = tok.encode("I will call the tool with a very long", add_special_tokens=False)  # no eos: hit max_tokens
    env = ScriptedEnv(["Please answer.", None])
    model = ScriptedModel([cut, tok.encode("ok", add_special_tokens=False) + [EOS_TOKEN_ID]])
    r = asyncio.run(run_episode(env, model, codec, "t", limits=RolloutLimits(max_tokens_per_call=64)))
    n = len(cut)
    assert r.response_ids[:n] == cut and r.response_mask[:n] == [1] * n
    assert r.response_ids[n] == EOS_TOKEN_ID and r.response_mask[n] == 0  # closing eos not sampled: masked
    assert spans(r.response_ids, r.response_mask, 1)[0] == cut
    assert all(p.max_tokens == 64 for p in model.params)
    # Release behaviour on request: the artificial closing eos is trained, nothing else changes.
    release = asyncio.run(run_episode(ScriptedEnv(["Please answer.", None]), ScriptedModel(model.outputs), codec, "t",
                                      limits=RolloutLimits(max_tokens_per_call=64), train_unsampled_eos=True))
    assert release.response_ids == r.response_ids
    assert [i for i, (a, b) in enumerate(zip(release.response_mask, r.response_mask, strict=True)) if a != b] == [n]


def test_logprobs_align_with_the_response(tok, codec):
    env = ScriptedEnv(["obs", None])
    model = ScriptedModel([tool_call_ids(tok), [EOS_TOKEN_ID]], logprobs=True)
    r = asyncio.run(run_episode(env, model, codec, "t"))
    assert r.response_logprobs is not None and len(r.response_logprobs) == len(r.response_ids)
    assert all(lp == 0.0 for lp, m in zip(r.response_logprobs, r.response_mask, strict=True) if m == 0)
    assert all(lp < 0 for lp, m in zip(r.response_logprobs, r.response_mask, strict=True) if m == 1)
    env2 = ScriptedEnv(["obs", None])
    assert asyncio.run(run_episode(env2, ScriptedModel([[EOS_TOKEN_ID]]), codec, "t")).response_logprobs is None


def test_prompt_too_long_is_excluded_without_generating(tok, codec):
    env = ScriptedEnv([None])
    model = ScriptedModel([[EOS_TOKEN_ID]])
    r = asyncio.run(run_episode(env, model, codec, "t", limits=RolloutLimits(max_prompt_length=10)))
    assert r.excluded and r.exclude_reason == "prompt_too_long" and len(r.prompt_ids) > 10
    assert model.calls == 0 and env.evaluated == [] and env.deleted == ["ep0"]


def test_overlong_response_is_truncated_keeping_the_head(tok, codec):
    gens = [tool_call_ids(tok), tool_call_ids(tok, "pwd"), [EOS_TOKEN_ID]]
    env = ScriptedEnv(["x" * 50, "y" * 50, None])
    full = asyncio.run(run_episode(ScriptedEnv(["x" * 50, "y" * 50, None]), ScriptedModel(gens), codec, "t"))
    r = asyncio.run(run_episode(env, ScriptedModel(gens), codec, "t", limits=RolloutLimits(max_response_length=40)))
    assert r.truncated and not full.truncated and len(full.response_ids) > 40
    assert r.response_ids == full.response_ids[:40] and r.response_mask == full.response_mask[:40]
    assert r.num_model_calls == 3 and r.reward == 1.0  # the full episode ran and was graded


def test_context_limit_stops_generation_but_still_grades(tok, codec):
    env = ScriptedEnv(["obs"] * 10)
    model = ScriptedModel([tool_call_ids(tok)])
    prompt_len = len(ChatCodec.for_tokenizer(tok).encode(
        tok.apply_chat_template([{"role": "system", "content": SYSTEM}, {"role": "user", "content": USER}],
                                tokenize=False, add_generation_prompt=True)))
    limits = RolloutLimits(max_model_len=prompt_len + 100 + 64, max_tokens_per_call=64)
    r = asyncio.run(run_episode(env, model, codec, "t", limits=limits))
    assert r.stop_reason == "context_limit" and r.num_model_calls >= 1
    assert len(model.prompts[-1]) < limits.max_model_len - limits.max_tokens_per_call
    assert len(r.prompt_ids) + len(r.response_ids) >= limits.max_model_len - limits.max_tokens_per_call
    assert env.evaluated == ["ep0"] and env.deleted == ["ep0"]


def test_max_model_calls_bounds_a_never_ending_episode(tok, codec):
    env = ScriptedEnv([])  # never done
    r = asyncio.run(run_episode(env, ScriptedModel([[EOS_TOKEN_ID]]), codec, "t",
                                limits=RolloutLimits(max_model_calls=5)))
    assert r.num_model_calls == 5 and r.stop_reason == "max_model_calls" and env.deleted == ["ep0"]


def test_long_observation_is_cut_with_a_marker(tok, codec):
    env = ScriptedEnv(["word " * 2000, None])
    r = asyncio.run(run_episode(env, ScriptedModel([[EOS_TOKEN_ID]]), codec, "t",
                                limits=RolloutLimits(max_observation_tokens=300)))
    obs_tokens = spans(r.response_ids, r.response_mask, 0)[0]
    assert len(obs_tokens) <= 300
    assert r.messages[3]["content"].endswith(OBS_TRUNCATION_MARKER)
    assert OBS_TRUNCATION_MARKER in tok.decode(obs_tokens)


def test_transient_env_failure_restarts_the_episode(tok, codec):
    env = ScriptedEnv([None], step_faults=[EnvUnavailable("boom")])
    r = asyncio.run(run_episode(env, ScriptedModel([[EOS_TOKEN_ID]]), codec, "t", restart_backoff=0))
    assert not r.excluded and r.attempts == 2 and r.reward == 1.0
    assert env.created == env.deleted == ["ep0", "ep1"]


def test_persistent_env_failure_is_excluded_as_infrastructure(tok, codec):
    env = ScriptedEnv([None], step_faults=[EnvUnavailable("down")] * 3,
                      create_faults=[])
    r = asyncio.run(run_episode(env, ScriptedModel([[EOS_TOKEN_ID]]), codec, "t", max_restarts=2,
                                restart_backoff=0))
    assert r.excluded and r.exclude_reason == "infrastructure" and r.attempts == 3 and r.reward == 0.0
    assert env.created == env.deleted == ["ep0", "ep1", "ep2"] and env.evaluated == []
    # Unreachable at create: nothing to delete, still excluded.
    env = ScriptedEnv([None], create_faults=[EnvUnavailable("down")] * 3)
    r = asyncio.run(run_episode(env, ScriptedModel([[EOS_TOKEN_ID]]), codec, "t", restart_backoff=0))
    assert r.excluded and r.exclude_reason == "infrastructure" and env.created == []


def test_vanished_episode_restarts_and_rejected_step_is_excluded(tok, codec):
    gone = EnvClientError(404, "unknown_episode", "expired")
    env = ScriptedEnv([None], step_faults=[gone])
    r = asyncio.run(run_episode(env, ScriptedModel([[EOS_TOKEN_ID]]), codec, "t", restart_backoff=0))
    assert not r.excluded and r.attempts == 2
    env = ScriptedEnv([None], step_faults=[EnvClientError(413, "too_large", "content too long")])
    r = asyncio.run(run_episode(env, ScriptedModel([[EOS_TOKEN_ID]]), codec, "t", restart_backoff=0))
    assert r.excluded and r.exclude_reason == "env_rejected:too_large" and env.deleted == ["ep0"]


def test_caller_errors_and_model_errors_propagate_after_cleanup(tok, codec):
    env = ScriptedEnv([None], create_faults=[EnvClientError(404, "unknown_task", "no such task")])
    with pytest.raises(EnvClientError):
        asyncio.run(run_episode(env, ScriptedModel([[EOS_TOKEN_ID]]), codec, "nope"))

    async def broken(prompt_ids, params):
        raise RuntimeError("model server died")

    env = ScriptedEnv([None])
    with pytest.raises(RuntimeError, match="model server died"):
        asyncio.run(run_episode(env, broken, codec, "t"))
    assert env.deleted == ["ep0"]


def test_protocol_violation_is_excluded(tok, codec):
    class Bad(ScriptedEnv):
        async def step(self, eid, content):
            return {"observation": None, "done": False}

    env = Bad([None])
    r = asyncio.run(run_episode(env, ScriptedModel([[EOS_TOKEN_ID]]), codec, "t"))
    assert r.excluded and r.exclude_reason == "env_protocol" and env.deleted == ["ep0"]


def test_protocol_errors_from_the_client_are_excluded(tok, codec):
    # EnvClient raises EnvProtocolError for a reply that breaks the protocol (tests/rollout/test_client.py).
    class BadStep(ScriptedEnv):
        async def step(self, eid, content):
            raise EnvProtocolError("reply is not a StepReply: observation is null but the episode is not done")

    env = BadStep([None])
    r = asyncio.run(run_episode(env, ScriptedModel([[EOS_TOKEN_ID]]), codec, "t"))
    assert r.excluded and r.exclude_reason == "env_protocol" and env.deleted == ["ep0"]

    class BadCreate(ScriptedEnv):
        async def create(self, *a, **k):
            raise EnvProtocolError("reply is not a CreateReply")

    env = BadCreate([None])
    r = asyncio.run(run_episode(env, ScriptedModel([[EOS_TOKEN_ID]]), codec, "t"))
    assert r.excluded and r.exclude_reason == "env_protocol" and r.attempts == 1 and env.created == []

    class UntypedEvaluate(ScriptedEnv):  # a stand-in that returns plain JSON instead of the reply model
        async def evaluate(self, eid):
            return {"accuracy": 1.0}

    env = UntypedEvaluate([None])
    r = asyncio.run(run_episode(env, ScriptedModel([[EOS_TOKEN_ID]]), codec, "t"))
    assert r.excluded and r.exclude_reason == "env_protocol" and env.deleted == ["ep0"]


def test_run_batch_preserves_order_and_bounds_concurrency(tok):
    active = peak = 0

    class Counting(ScriptedEnv):
        async def create(self, *a, **k):
            nonlocal active, peak
            active += 1
            peak = max(peak, active)
            return await super().create(*a, **k)

        async def delete(self, eid):
            nonlocal active
            active -= 1
            await super().delete(eid)

    env = Counting(["obs", None])
    model = ScriptedModel([[EOS_TOKEN_ID]], delay=0.01)
    reqs = [EpisodeRequest(task_id=f"task{i}", mode="eval" if i % 2 else "train") for i in range(12)]
    done = []
    out = asyncio.run(run_batch(env, model, tok, reqs, concurrency=3, on_done=lambda i, r: done.append(i)))
    assert [r.task_id for r in out] == [q.task_id for q in reqs]
    assert [r.mode for r in out] == [q.mode for q in reqs]
    assert peak == 3 and sorted(done) == list(range(12))
    assert sorted(env.deleted) == sorted(env.created) and len(env.created) == 12


def test_run_batch_cancels_and_cleans_up_on_a_fatal_error(tok):
    calls = itertools.count()

    async def flaky(prompt_ids, params):
        await asyncio.sleep(0.01)
        if next(calls) == 2:
            raise RuntimeError("fatal")
        await asyncio.sleep(0.2)
        return Generation([EOS_TOKEN_ID], "stop")

    env = ScriptedEnv([None])
    with pytest.raises(RuntimeError, match="fatal"):
        asyncio.run(run_batch(env, flaky, tok, [EpisodeRequest(f"t{i}") for i in range(6)], concurrency=6))
    assert sorted(env.deleted) == sorted(env.created) and len(env.created) == 6

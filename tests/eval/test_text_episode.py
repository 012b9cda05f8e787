"""Evaluation policies through the one episode driver: the text level (`TextTurns`) under the same rules as
the token level (limits, restarts, exclusions, cleanup), and what the records make of it (scripted env)."""

from __future__ import annotations

import asyncio

import pytest

from seal.eval.policies import ContextLimitReached, Policy, PolicyError, TextTurns, constant_agent, scripted_agent
from seal.eval.results import record_from_rollout
from seal.models.qwen25 import EOS_TOKEN_ID, build_qwen_tokenizer
from seal.rollout.client import EnvClientError, EnvUnavailable
from seal.rollout.codec import ChatCodec
from seal.rollout.episode import TokenTurns, play_episode
from seal.rollout.types import RolloutLimits, SamplingParams
from tests.rollout.scripted import SYSTEM, USER, ScriptedEnv, ScriptedModel

HEAD = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": USER}]


def play(env, agent, **kwargs):
    return asyncio.run(play_episode(env, lambda: TextTurns(agent), "t", "eval", restart_backoff=0, **kwargs))


def test_text_episode_transcript_and_grade():
    env = ScriptedEnv(["obs 1", "obs 2", None])
    seen = []

    async def agent(messages):
        seen.append(messages)
        return f"reply {len(seen)}"

    r = play(env, agent)
    assert not r.excluded and r.stop_reason == "done" and r.num_model_calls == 3 and r.attempts == 1
    assert r.messages == [*HEAD, {"role": "assistant", "content": "reply 1"}, {"role": "user", "content": "obs 1"},
                          {"role": "assistant", "content": "reply 2"}, {"role": "user", "content": "obs 2"},
                          {"role": "assistant", "content": "reply 3"}]
    # The agent sees the conversation so far, as a copy (the driver keeps appending to its own transcript).
    assert seen[0] == HEAD and seen[2] == r.messages[:-1]
    assert [c for _, c in env.steps] == ["reply 1", "reply 2", "reply 3"]
    assert r.accuracy == r.reward == 1.0 and r.failure_tags == ["pass"] and r.category == "base"
    assert r.prompt_ids == [] and r.response_ids == []  # no token bookkeeping at the text level
    assert env.created == env.deleted == env.evaluated == ["ep0"]
    assert record_from_rollout(r)["accuracy"] == 1 and record_from_rollout(r)["error"] is None


def test_text_and_token_levels_share_the_driver():
    """The same replies at both levels: the same transcript, steps, stop reason and grade."""
    tok = build_qwen_tokenizer()
    replies = ["first answer", "second answer"]
    text_env, token_env = ScriptedEnv(["obs", None]), ScriptedEnv(["obs", None])
    text = play(text_env, scripted_agent(replies))
    model = ScriptedModel([tok.encode(t, add_special_tokens=False) + [EOS_TOKEN_ID] for t in replies])
    codec = ChatCodec.for_tokenizer(tok)
    token = asyncio.run(play_episode(token_env, lambda: TokenTurns(model, codec, SamplingParams(), RolloutLimits()),
                                     "t", "eval"))
    assert text.messages == token.messages and text_env.steps == token_env.steps
    assert (text.stop_reason, text.num_model_calls, text.accuracy) == (token.stop_reason, token.num_model_calls,
                                                                       token.accuracy)
    assert token.response_ids and not text.response_ids


def test_max_model_calls_bounds_a_text_episode():
    env = ScriptedEnv([])  # never done
    r = play(env, constant_agent("again"), max_model_calls=4)
    assert r.num_model_calls == 4 and r.stop_reason == "max_model_calls" and env.evaluated == ["ep0"]


def test_context_limit_from_the_agent_stops_and_grades():
    calls = []

    async def agent(messages):
        calls.append(1)
        if len(calls) == 2:
            raise ContextLimitReached("maximum context length is 16384 tokens")
        return "thinking"

    env = ScriptedEnv(["obs"] * 5)
    r = play(env, agent)
    assert r.stop_reason == "context_limit" and r.num_model_calls == 1
    assert r.messages[-1] == {"role": "error", "content": "maximum context length is 16384 tokens"}
    assert env.evaluated == ["ep0"] and env.deleted == ["ep0"]
    assert record_from_rollout(r)["error"] is None  # graded as it stands, not an error


def test_restart_gives_the_attempt_a_fresh_agent():
    # A scripted replay must start over on a restarted episode, or it would skip its first replies.
    env = ScriptedEnv([None], step_faults=[EnvUnavailable("boom")])
    policy = Policy("test:scripted", "text", lambda task_id: scripted_agent(["call 1", "call 2"]))
    r = asyncio.run(play_episode(env, policy.episode_turns("t", RolloutLimits()), "t", "eval", restart_backoff=0))
    assert not r.excluded and r.attempts == 2
    assert env.steps == [("ep0", "call 1"), ("ep1", "call 1")]
    assert env.created == env.deleted == ["ep0", "ep1"]


def test_persistent_env_failure_is_excluded_and_the_record_fails():
    env = ScriptedEnv([None], step_faults=[EnvUnavailable("down")] * 3)
    r = play(env, constant_agent("x"))
    assert r.excluded and r.exclude_reason == "infrastructure" and r.attempts == 3
    assert env.created == env.deleted == ["ep0", "ep1", "ep2"] and env.evaluated == []
    record = record_from_rollout(r)
    # Evaluation scores every task: an excluded episode is a failure with the reason, never dropped.
    assert record["accuracy"] == 0 and record["error"] == "excluded (infrastructure): down"
    assert record["stop_reason"] == "excluded"


def test_vanished_episode_restarts_rejected_step_and_broken_protocol_are_excluded():
    gone = EnvClientError(404, "unknown_episode", "expired")
    env = ScriptedEnv([None], step_faults=[gone])
    r = play(env, constant_agent("x"))
    assert not r.excluded and r.attempts == 2

    env = ScriptedEnv([None], step_faults=[EnvClientError(413, "too_large", "content too long")])
    r = play(env, constant_agent("x"))
    assert r.excluded and r.exclude_reason == "env_rejected:too_large" and env.deleted == ["ep0"]
    assert record_from_rollout(r)["accuracy"] == 0 and "env_rejected:too_large" in record_from_rollout(r)["error"]

    class NoVerdict(ScriptedEnv):
        async def evaluate(self, eid):
            return {"progress": 1.0}

    env = NoVerdict([None])
    r = play(env, constant_agent("x"))
    assert r.excluded and r.exclude_reason == "env_protocol" and env.deleted == ["ep0"]


def test_agent_errors_propagate_after_cleanup():
    async def not_text(messages):
        return 42

    env = ScriptedEnv([None])
    with pytest.raises(PolicyError, match="policy returned int, not text"):
        play(env, not_text)
    assert env.deleted == ["ep0"] and env.evaluated == []

    env = ScriptedEnv([None], create_faults=[EnvClientError(404, "unknown_task", "no such task")])
    with pytest.raises(EnvClientError):
        play(env, constant_agent("x"))
    assert env.created == []

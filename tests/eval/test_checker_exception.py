"""An exception inside BFCL's checker is never a silent 0 (docs/run_directory.md, evaluation directory).

BFCL's checker does not raise on BFCL's own data, so the exception is provoked by replacing
``multi_turn_checker`` inside the service's grading with one that raises (the only stand-in here); everything
after it is real: the service's ``grade`` reply, the protocol's reply model, the episode driver, the record, the
summary, the notes and the exit-code rule of ``seal.evaluate``.
"""

from __future__ import annotations

import asyncio

from env_service import grading, vocab
from env_service.config import EpisodeConfig, StepLimit
from env_service.parser import format_tool_call
from env_service.tasks import load_tasks
from seal.eval.evaluate import _errored
from seal.eval.notes import error_notes
from seal.eval.results import build_summary, record_from_rollout
from seal.rollout.episode import play_episode
from tests.helpers import play_turns
from tests.rollout.scripted import ScriptedEnv

TASK = "multi_turn_base_25"


def _graded_reply(monkeypatch, raise_in_checker: bool) -> dict:
    """The service's evaluate reply for the ground truth of TASK, BFCL's checker raising or not."""
    if raise_in_checker:
        def broken(*args, **kwargs):
            raise KeyError("a checker bug")
        monkeypatch.setattr(grading, "multi_turn_checker", broken)
    task = load_tasks()[TASK]
    turns = [[format_tool_call(c.name, c.arguments) for c in calls] for calls in task.gt_calls]
    episode = play_turns(task, turns, EpisodeConfig(step_limit=StepLimit("episode", 200)), mode="train")
    return {**episode.evaluate(), "grade_ms": 1.0, "end_reason": "completed", "steps": 2}


def _play(reply: dict, mode: str):
    env = ScriptedEnv([None], eval_result=reply)
    return asyncio.run(play_episode(env, lambda: _TextTurns(), TASK, mode))


class _TextTurns:
    """The smallest Turns: one plain reply; the scripted env ends the episode and returns ``reply``."""

    def open(self, out, head):
        return None

    async def reply(self, out, messages):
        return "done"

    def observe(self, out, obs):
        pass

    def close(self, out):
        pass


def test_checker_exception_is_a_harness_failure_in_the_service_reply(monkeypatch):
    reply = _graded_reply(monkeypatch, raise_in_checker=True)
    assert reply["official"]["error_type"] == vocab.CHECKER_EXCEPTION and "a checker bug" in \
        reply["official"]["error_message"]
    assert reply["accuracy"] == 0.0
    # every turn replayed fine, so the service's own cross-check flags the verdict as inconsistent too
    assert set(reply["failure_tags"]) == {vocab.PASS} and reply["official"]["consistent_with_turns"] is False


def test_checker_exception_excludes_the_episode_from_training(monkeypatch):
    rollout = _play(_graded_reply(monkeypatch, raise_in_checker=True), "train")
    assert rollout.excluded and rollout.exclude_reason == vocab.CHECKER_ERROR
    assert rollout.record().excluded  # what A-Patch, the capability state and both engines' batches read
    # the same reply with a working checker trains as usual
    monkeypatch.undo()
    clean = _play(_graded_reply(monkeypatch, raise_in_checker=False), "train")
    assert not clean.excluded and clean.accuracy == 1.0


def test_checker_exception_errors_the_evaluation(monkeypatch):
    rollout = _play(_graded_reply(monkeypatch, raise_in_checker=True), "eval")
    record = record_from_rollout(rollout, rules="release")
    assert record["accuracy"] == 0 and "BFCL's checker raised" in record["error"] and "a checker bug" in \
        record["error"]
    assert record["consistent_with_turns"] is False
    notes = error_notes([record])
    summary = build_summary([record], "ground_truth", "test", 1.0, notes)
    assert summary["checker_errors"] == [TASK] and summary["inconsistent_verdicts"] == [TASK]
    assert any("inside BFCL's checker" in n and TASK in n for n in summary["notes"])
    assert _errored(summary)  # seal.evaluate's exit code is 1


def test_an_inconsistent_verdict_is_reported_without_erroring(monkeypatch):
    reply = _graded_reply(monkeypatch, raise_in_checker=False)
    reply["official"]["consistent_with_turns"] = False  # as the service reports a disagreement
    rollout = _play(reply, "eval")
    assert not rollout.excluded
    record = record_from_rollout(rollout)
    summary = build_summary([record], "p", "test", 1.0, error_notes([record]))
    assert summary["inconsistent_verdicts"] == [TASK] and summary["checker_errors"] == []
    assert any("disagrees with their per-turn diagnosis" in n for n in summary["notes"])

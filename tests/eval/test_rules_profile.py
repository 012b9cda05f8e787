"""The rules profile per episode: the create request's `rules`, the service's default for eval episodes
(`--eval-rules`, the recipe's `env.val_rules`), and the official profile's prompt and reveal texts as BFCL
builds them (BFCL's own pipeline is the oracle in test_bfcl_oracle.py)."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest

from env_service import official, vocab
from env_service.app import create_app
from env_service.bfcl import DEFAULT_USER_PROMPT_FOR_ADDITIONAL_FUNCTION_PROMPTING
from env_service.config import ServiceConfig
from env_service.tasks import load_tasks
from seal.recipe import derived

MISS_FUNC = "multi_turn_miss_func_0"


def create(config: ServiceConfig, **body) -> list[httpx.Response]:
    async def go():
        transport = httpx.ASGITransport(app=create_app(config))
        async with httpx.AsyncClient(transport=transport, base_url="http://service") as client:
            created = await client.post("/episodes", json={"task_id": MISS_FUNC, **body})
            replies = [created]
            if created.status_code == 201:
                eid = created.json()["episode_id"]
                replies.append(await client.post(f"/episodes/{eid}/step", json={"content": "Done."}))
            return replies

    return asyncio.run(go())


def test_official_episode_shows_bfcls_prompt_and_reveal_message():
    task = load_tasks()[MISS_FUNC]
    created, stepped = create(ServiceConfig(), mode="eval", rules="official")
    assert created.status_code == 201, created.text
    reply = created.json()
    assert reply["info"]["rules"] == "official"
    docs = [json.loads(json.dumps(d)) for d in task.tools]
    for doc in docs:
        doc["description"] += " Note that the provided function is in Python 3 syntax."
    assert reply["tools"] == docs
    system = reply["messages"][0]["content"]
    tool_lines = [line for line in system.splitlines() if line.startswith('{"name": "')]
    assert tool_lines == [json.dumps(d) for d in docs]
    # the turn ends with a plain reply; the next turn of this task reveals its held-out function
    reveal_turn = min(task.held_out)
    if reveal_turn == 1:
        expected = DEFAULT_USER_PROMPT_FOR_ADDITIONAL_FUNCTION_PROMPTING.format(functions=task.held_out[1])
        assert stepped.json()["observation"]["content"] == expected
        assert expected.startswith("[{'name': ")  # a Python list, as BFCL's prompting mode prints it


def test_release_is_the_default_and_eval_rules_set_validation_episodes():
    created, _ = create(ServiceConfig(), mode="eval")
    assert created.json()["info"]["rules"] == "release"
    service = ServiceConfig(eval_rules="official")
    assert create(service, mode="eval")[0].json()["info"]["rules"] == "official"
    assert create(service, mode="train")[0].json()["info"]["rules"] == "release"  # training stays release
    assert create(service, mode="eval", rules="release")[0].json()["info"]["rules"] == "release"


def test_official_rules_refuse_an_interface_and_unknown_profiles():
    refused = create(ServiceConfig(), mode="train", rules="official", interface={"error_feedback": True})[0]
    assert refused.status_code == 422 and "official rules" in refused.text
    assert create(ServiceConfig(), mode="eval", rules="bfcl")[0].status_code == 422


def test_recipe_val_rules_reach_the_service_the_launcher_starts():
    from seal.recipe.schema import EnvConfig, Recipe

    assert "--eval-rules" not in derived.env_service_args(Recipe())
    args = derived.env_service_args(Recipe(env=EnvConfig(val_rules="official")))
    assert args[args.index("--eval-rules") + 1] == "official"


@pytest.mark.parametrize(("reply", "calls", "error", "breaks"), [
    ('<tool_call>\n{"name": "ls", "arguments": {}}\n</tool_call>', 1, False, False),
    ('<tool_call>{"name": "ls", "arguments": {}}</tool_call>', 0, False, False),  # no newlines: plain text
    ('<tool_call>\n{"name": "ls", "arguments": {}}\n</tool_call>\n<tool_call>\n{bad\n</tool_call>', 1, False, False),
    ('<tool_call>\n[1]\n</tool_call>', 0, True, True),
    ('<tool_call>\n{"name": "ls"}\n</tool_call>', 0, True, True),
    ('<tool_call>\n{"name": "ls", "arguments": "{\\"a\\": 1}"}\n</tool_call>', 1, False, False),
    ('<tool_call>\n{"name": "ls", "arguments": [1]}\n</tool_call>', 0, True, False),
    ('<tool_call>\n{"name": 5, "arguments": {}}\n</tool_call>', 1, False, True),
    ('<think>\n<tool_call>\n{"name": "ls", "arguments": {}}\n</tool_call>\n</think>\n\nno call', 0, False, False),
])
def test_decode_follows_bfcls_qwen_reading(reply, calls, error, breaks):
    decoded = official.decode(reply)
    assert (len(decoded.calls), decoded.error is not None, decoded.breaks_history) == (calls, error, breaks)


def test_calls_that_can_only_fail_get_pythons_error_text_and_never_reach_the_checker():
    assert official.failure_text("nonexistent", {"a": 1}, known=False) == \
        "Error during execution: name 'nonexistent' is not defined"
    assert official.failure_text("kill", {}, known=False) == \
        "Error during execution: Function call kill is not allowed."
    assert official.failure_text("ls", {"a": float("nan")}, known=True) == \
        "Error during execution: name 'nan' is not defined"
    assert "invalid syntax" in official.failure_text("ls", {"not a name": 1}, known=True)
    assert official.failure_text(5, {}, known=False) == "Error during execution: 'int' object is not callable"
    assert official.failure_text("ls", {"a": 1}, known=True) is None
    assert official.checker_call("nonexistent", {}, runnable=False) == official.UNRUNNABLE_CALL


def test_an_official_evaluation_names_its_rules_in_every_file_and_table(service_url, tmp_path, capsys):
    from seal.eval import evaluate as ev
    from seal.eval import held_in
    from seal.eval import notes as summary_notes

    tasks = ["multi_turn_miss_func_49", "multi_turn_base_0"]
    summary = held_in.evaluate(held_in.EvalRequest(policy="ground_truth", out=tmp_path, tasks=tasks,
                                                   env_url=service_url, rules="official", progress=False))
    # BFCL executes the held-out `tail` the ground truth calls before its reveal: the anomaly passes here
    assert summary["accuracy"]["multi_turn_miss_func"] == 1.0
    assert summary["rules"] == "official" and summary["status"] == "complete"
    written = json.loads((tmp_path / "summary.json").read_text())
    assert written["rules"] == "official"
    records = [json.loads(line) for line in (tmp_path / "results.jsonl").read_text().splitlines()]
    assert [r["task_id"] for r in records] == tasks and {r["rules"] for r in records} == {"official"}
    summary_notes.print_summary(summary, tmp_path)
    assert "| rules official |" in capsys.readouterr().out
    args = ev.parse_args(["--policy", "empty", "--rules", "official", "--split", "all"])
    assert str(ev._default_out(args, None)) == "evals/empty_all_official"
    with pytest.raises(SystemExit):
        ev.parse_args(["--policy", "empty", "--rules", "official", "--max-steps", "5"])


def test_official_budget_has_no_length_limits_of_its_own():
    from seal.eval.held_in import EpisodeBudget

    limits = EpisodeBudget(4096, 32768, official=True).rollout_limits()
    assert limits.max_observation_tokens is None and limits.max_prompt_length == 32767
    assert limits.max_response_length == limits.max_model_len == 32768
    release = EpisodeBudget().rollout_limits()
    assert release.max_observation_tokens == 4096 and release.max_prompt_length == 8192


def _official_block(name: str, **arguments) -> str:
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": arguments}) + "\n</tool_call>"


def test_official_calls_to_tools_that_do_not_exist_reach_the_diagnosis_and_not_the_verdict():
    from env_service.config import EpisodeConfig
    from env_service.episode import Episode
    from env_service.interface import parse_interface

    task = load_tasks()["multi_turn_miss_param_120"]
    assert not task.gt_calls[0]  # the model should not call anything on turn 0

    def play(rules: str, hallucinated: bool):
        episode = Episode("t", task, "eval", parse_interface(None), EpisodeConfig(), rules=rules)
        script = [["\n".join(_official_block(f"made_up_{k}", x=k) for k in range(3))] if hallucinated else []]
        script += [["\n".join(_official_block(c.name, **c.arguments) for c in calls)] for calls in task.gt_calls[1:]]
        for messages in script:
            for content in messages:
                episode.step(content)
            if not episode.done:
                episode.step("Done.")
        return episode.evaluate()

    result = play("official", hallucinated=True)
    turn0 = result["turns"][0]
    # recorded as rejected calls, as the release rules record them: the paper's "calls a tool that does not exist"
    assert (turn0["model_calls"], turn0["unavailable_calls"]) == (0, 3)
    assert result["paper_labels"][0] == vocab.INVALID_TOOL_CALL
    assert result["paper_labels"][0] == play("release", hallucinated=True)["paper_labels"][0]
    # the progress tag is the release's (a rejected attempt is an abstention there too)
    assert result["failure_tags"][0] == play("release", hallucinated=True)["failure_tags"][0]
    # BFCL's verdict does not see them: the same as the episode without the made-up calls
    clean = play("official", hallucinated=False)
    assert clean["paper_labels"][0] == "pass"
    assert (result["accuracy"], result["official"]["valid"]) == (clean["accuracy"], clean["official"]["valid"])
    assert result["failure_tags"][1:] == clean["failure_tags"][1:]

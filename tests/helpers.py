"""Small helpers shared by the tests."""

from __future__ import annotations


def sampled_spans(ids: list[int], mask: list[int]) -> list[list[int]]:
    """The runs of ``ids`` where ``mask`` is 1: the model's sampled spans of a token-exact response."""
    out, cur = [], []
    for value, keep in zip(ids, mask, strict=True):
        if keep:
            cur.append(value)
        elif cur:
            out.append(cur)
            cur = []
    return out + ([cur] if cur else [])

"""Prompt lookup: draft tokens by copying what followed an earlier occurrence of the context's tail.

Stdlib only: it runs inside the inferlet and in the tests.
"""

from __future__ import annotations


def lookup(tokens: list[int], max_n: int, max_draft: int) -> list[int]:
    """Up to ``max_draft`` tokens that followed the earliest earlier occurrence of the longest
    suffix n-gram of ``tokens`` (n from ``max_n`` down to 1); empty when no suffix recurs.

    The earliest occurrence leaves the longest continuation; it may run into the suffix itself,
    which is what lets a loop of period p be drafted from p + n tokens.
    """
    if max_draft <= 0:
        return []
    for n in range(min(max_n, len(tokens) - 1), 0, -1):
        suffix = tokens[-n:]
        for start in range(len(tokens) - n):
            if tokens[start:start + n] == suffix:
                return tokens[start + n:start + n + max_draft]
    return []

"""A prefix index over token sequences, keyed by pages: which stored sequence shares the longest
prefix with a new one (the server side of named KV snapshots' reuse, ``exports.py``).

A trie whose edges are whole pages of tokens (``page_size`` token ids each), as the KV cache is
laid out: walking the new sequence page by page finds, in one dict lookup per page, the deepest
page every candidate shares with it; only then are the candidates below that node compared
token by token, over at most one page. So a match costs O(pages of the query + candidates x one
page), not O(every stored token). Pure bookkeeping: no pages, no pools, no I/O.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence


class _Node:
    __slots__ = ("children", "keys")

    def __init__(self) -> None:
        self.children: dict[tuple[int, ...], _Node] = {}
        self.keys: list[Hashable] = []  # entries whose full pages reach this node, oldest first


class PrefixIndex:
    """Stored token sequences by key; :meth:`longest` finds the one sharing the longest prefix."""

    def __init__(self, page_size: int):
        if page_size <= 0:
            raise ValueError(f"page_size must be positive, got {page_size}")
        self.page_size = page_size
        self._root = _Node()
        self._tokens_by_key: dict[Hashable, tuple[int, ...]] = {}

    def __len__(self) -> int:
        return len(self._tokens_by_key)

    def add(self, key: Hashable, tokens: Sequence[int]) -> None:
        """Store ``tokens`` under ``key`` (ValueError if the key is stored already)."""
        if key in self._tokens_by_key:
            raise ValueError(f"{key!r} is in the index already")
        tokens = tuple(tokens)
        self._tokens_by_key[key] = tokens
        node = self._root
        node.keys.append(key)
        for chunk in self._full_pages(tokens):
            node = node.children.setdefault(chunk, _Node())
            node.keys.append(key)

    def remove(self, key: Hashable) -> None:
        """Forget ``key`` (KeyError if it is not stored), pruning the pages no other entry reaches."""
        tokens = self._tokens_by_key.pop(key)
        node = self._root
        node.keys.remove(key)
        for chunk in self._full_pages(tokens):
            child = node.children[chunk]
            child.keys.remove(key)
            if not child.keys:
                del node.children[chunk]
                return
            node = child

    def longest(self, tokens: Sequence[int]) -> tuple[Hashable | None, int]:
        """The key whose tokens share the longest prefix with ``tokens``, and that prefix's length;
        the oldest of those tied; ``(None, 0)`` when none shares even the first token."""
        ps, node, depth = self.page_size, self._root, 0
        while (depth + 1) * ps <= len(tokens):
            child = node.children.get(tuple(tokens[depth * ps:(depth + 1) * ps]))
            if child is None:
                break
            node, depth = child, depth + 1
        base = depth * ps
        tail = tokens[base:base + ps]
        best_key, best_len = None, 0
        for key in node.keys:
            stored = self._tokens_by_key[key]
            length = base + _common_prefix(stored[base:base + ps], tail)
            if length > best_len:
                best_key, best_len = key, length
        return best_key, best_len

    def _full_pages(self, tokens: tuple[int, ...]):
        ps = self.page_size
        return (tokens[i:i + ps] for i in range(0, len(tokens) - ps + 1, ps))


def _common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n

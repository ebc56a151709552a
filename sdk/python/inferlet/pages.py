"""PageTable: a context's KvPage handles, with reference counts for pages shared by forks.

Page handles belong to the instance, not to a context: a fork holds the same handles as its parent
for the pages they share. Each page carries a ``_Holders`` record shared by every table that holds
it, counting those tables; the last one to let go deallocates the page. The record also says
whether the page is exported (ours, published under a name) or imported (another's export): other
instances read it, so it is shared for good. A shared page is immutable: a context that must write
into one (after ``truncate``, or to mask tokens) copies it first. The Rust SDK's ``PageTable``
(``sdk/rust/oven/src/pages.rs``) is the same table, with ``Rc`` counts.
"""

from __future__ import annotations


class _Holders:
    __slots__ = ("count", "exported")

    def __init__(self):
        self.count, self.exported = 1, False


class PageTable:
    __slots__ = ("handles", "_holders")

    def __init__(self):
        self.handles: list[int] = []  # read-only outside this class
        self._holders: list[_Holders] = []

    def __len__(self) -> int:
        return len(self.handles)

    def push(self, handle: int) -> None:
        self.handles.append(handle)
        self._holders.append(_Holders())

    def mark_exported(self, count: int) -> None:
        """Mark the first ``count`` pages as shared with an export (exported or imported)."""
        for holders in self._holders[:count]:
            holders.exported = True

    def is_shared(self, index: int) -> bool:
        """True if another context or an export holds page ``index`` too."""
        holders = self._holders[index]
        return holders.count > 1 or holders.exported

    def share_prefix(self, count: int) -> PageTable:
        """A table holding the first ``count`` pages of this one, shared."""
        table = PageTable()
        table.handles, table._holders = self.handles[:count], self._holders[:count]
        for holders in table._holders:
            holders.count += 1
        return table

    def replace(self, index: int, handle: int) -> int | None:
        """Put a fresh page in place of page ``index``; the old handle if no other context holds it
        (an export keeps its pages whether or not we hold a handle on them)."""
        old, holders = self.handles[index], self._holders[index]
        holders.count -= 1
        self.handles[index], self._holders[index] = handle, _Holders()
        return old if holders.count == 0 else None

    def truncate(self, count: int) -> list[int]:
        """Keep the first ``count`` pages; the handles let go that nobody else holds."""
        freed = []
        for handle, holders in zip(self.handles[count:], self._holders[count:]):
            holders.count -= 1
            if holders.count == 0:
                freed.append(handle)
        del self.handles[count:], self._holders[count:]
        return freed

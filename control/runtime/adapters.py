"""LoRA adapters by name, with the ids the control process gives them.

The control process, not the inference process, owns adapter ids: each name
gets an id when it is registered (1, 2, ...; 0 is the base model) and keeps it
while the server runs, and an id is never given to another adapter. So when the
inference process is restarted, :meth:`Adapters.reload` loads every adapter again
under the same id before any batch is sent (the inference process answers in
order), and an inferlet holding an id from ``open-adapter`` goes on unchanged.
With several inference replicas every adapter is loaded on each: it is loaded once
all have accepted it, failed if one refused it.

Registered adapters are those that ship with oven for the served model and those of the
:class:`~oven.control.adapter_store.AdapterStore`, loaded at start
(:meth:`Adapters.load_stored`), plus those an operator adds while
the server runs (:meth:`Adapters.add`, kept in the store only once the inference
process accepts them). Loading is asynchronous: the loop hands each reply to
:meth:`Adapters.settle`.
"""

from __future__ import annotations

import itertools
import logging
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from oven.control.adapter_store import AdapterStore, AdapterStoreError, packaged_adapters
from oven.proto import inference as p

log = logging.getLogger(__name__)

LOADING, LOADED, FAILED = "loading", "loaded", "failed"


class AdapterUnavailable(ValueError):
    """``open-adapter`` of a name that cannot be used; the message is one line for the inferlet."""


@dataclass(slots=True)
class Adapter:
    name: str
    adapter_id: int
    path: str  # its folder in the store, or in the package
    packaged: bool = False  # ships with oven (see adapter_store.PACKAGED): not removable
    state: str = LOADING  # LOADING | LOADED | FAILED
    error: str = ""  # why it failed to load
    info: p.AdapterInfo | None = None  # from the inference process, once loaded
    on_loaded: Callable[[Adapter], None] | None = None  # an operator's add waiting for the outcome
    waiting: set[int] = field(default_factory=set)  # replicas that have not answered its load yet


class Adapters:
    """``send(replica, request) -> request id`` sends to inference replica ``replica`` (0 to
    ``num_replicas`` - 1, its current process); ``info`` is what they serve."""

    def __init__(self, store: AdapterStore, send: Callable[[int, object], int], info: p.InfoReply,
                 num_replicas: int = 1):
        self.store, self._send, self.num_replicas = store, send, num_replicas
        self.supported = p.TRAIT_LORA_ADAPTERS in info.traits
        self._unsupported = f"this server takes no LoRA adapters ({info.model_name} lacks the lora-adapters trait)"
        self.model_name = info.model_name
        self._by_name: dict[str, Adapter] = {}
        self._ids = itertools.count(1)
        self._pending: dict[tuple[int, int], str] = {}  # (replica, request id) -> adapter name
        self.num_opened: Counter[str] = Counter()  # instances' opens by adapter name (oven:adapter_requests)

    # -- what instances and clients read ------------------------------------------------------

    def entries(self) -> list[Adapter]:
        return sorted(self._by_name.values(), key=lambda a: a.adapter_id)

    def open(self, name: str) -> int:
        """The id of the loaded adapter ``name``; AdapterUnavailable saying why not."""
        if not self.supported:
            raise AdapterUnavailable(self._unsupported)
        adapter = self._by_name.get(name)
        if adapter is None:
            known = ", ".join(sorted(self._by_name)) or "none; an operator adds them with `oven adapters add`"
            raise AdapterUnavailable(f"no adapter named {name!r} on this server (it has: {known})")
        if adapter.state == FAILED:
            raise AdapterUnavailable(f"adapter {name!r} failed to load: {adapter.error}")
        if adapter.state == LOADING:
            raise AdapterUnavailable(f"adapter {name!r} is still loading; try again in a moment")
        self.num_opened[name] += 1
        return adapter.adapter_id

    def is_loaded(self, adapter_id: int) -> bool:
        return any(a.adapter_id == adapter_id and a.state == LOADED for a in self._by_name.values())

    # -- loading ------------------------------------------------------------------------------

    def load_stored(self, wait: Callable[[int, int], object]) -> None:
        """At start: load the packaged adapters for the served model, then every stored one, waiting
        for each reply with ``wait(replica, request_id)``."""
        if not self.supported:
            if self.store.names():
                log.warning("%s: the %d stored ones are not loaded", self._unsupported, len(self.store.names()))
            return
        packaged = packaged_adapters(self.model_name)
        folders = {**{name: (path, True) for name, path in packaged.items()},
                   **{name: (self.store.path(name), False) for name in self.store.names() if name not in packaged}}
        for name, (path, is_packaged) in folders.items():
            adapter = self._register(name, str(path))
            adapter.packaged = is_packaged
            for replica, request_id in self._load(adapter):
                self.settle(replica, request_id, wait(replica, request_id))

    def add(self, name: str, folder: Path, on_loaded: Callable[[Adapter], None]) -> None:
        """Copy ``folder`` into the store as ``name`` and load it; ``on_loaded(adapter)`` once the
        inference process answered (a refused one is then gone from the store and from here).
        AdapterStoreError / AdapterUnavailable for what is refused at once."""
        if not self.supported:
            raise AdapterUnavailable(self._unsupported)
        if name in self._by_name:
            raise AdapterStoreError(f"an adapter named {name!r} exists; remove it first (oven adapters remove {name})")
        path = self.store.add(name, folder)
        adapter = self._register(name, str(path))
        adapter.on_loaded = on_loaded
        self._load(adapter)

    def remove(self, name: str) -> None:
        """Unload ``name`` and delete it from the store; its id is never used again.
        AdapterStoreError for an unknown, packaged or still loading one."""
        adapter = self._by_name.get(name)
        if adapter is None:
            self.store.remove(name)  # one stored while the model takes none, or "no adapter named ..."
            return
        if adapter.packaged:
            raise AdapterStoreError(f"adapter {name!r} ships with oven and cannot be removed")
        if adapter.state == LOADING:
            raise AdapterStoreError(f"adapter {name!r} is still loading; remove it once it has loaded")
        del self._by_name[name]
        if adapter.state == LOADED:  # the inference process answers in order: later items naming it fail
            for replica in range(self.num_replicas):
                self._send(replica, p.UnloadAdapterRequest(name))
        self.store.remove(name)

    def settle(self, replica: int, request_id: int, reply) -> bool:
        """Take replica ``replica``'s reply to one of our load requests; False if ``request_id`` is not ours."""
        name = self._pending.pop((replica, request_id), None)
        if name is None:
            return False
        adapter = self._by_name.get(name)
        if adapter is None:
            return True
        adapter.waiting.discard(replica)
        if isinstance(reply, p.AdapterReply):
            adapter.info = reply.adapter
        elif adapter.state != FAILED:
            adapter.state = FAILED
            adapter.error = reply.message if isinstance(reply, p.ErrorReply) else f"unexpected reply {reply!r}"
            log.warning("adapter %r was refused: %s", name, adapter.error)
        if adapter.waiting:
            return True
        if adapter.state == LOADING:
            adapter.state, adapter.error = LOADED, ""
            log.info("adapter %r loaded as id %d", name, adapter.adapter_id)
        if adapter.on_loaded is not None:
            on_loaded, adapter.on_loaded = adapter.on_loaded, None
            if adapter.state == FAILED:  # an add that failed leaves nothing behind (nor on a replica that took it)
                del self._by_name[name]
                self.store.remove(name)
                for other in range(self.num_replicas):
                    self._send(other, p.UnloadAdapterRequest(name))
            on_loaded(adapter)
        return True

    def reload(self, replica: int) -> None:
        """A new process of ``replica`` serves: load every adapter there again under its id (replies to the
        dead process's load requests will never come; an add that waited on one waits on this)."""
        for key in [key for key in self._pending if key[0] == replica]:
            del self._pending[key]
        for adapter in self.entries():
            if adapter.state != FAILED:
                self._load(adapter, [replica])

    def _register(self, name: str, path: str) -> Adapter:
        adapter = Adapter(name, next(self._ids), path)
        self._by_name[name] = adapter
        return adapter

    def _load(self, adapter: Adapter, replicas: list[int] | None = None) -> list[tuple[int, int]]:
        """Send its load to ``replicas`` (every one by default); the (replica, request id) of each."""
        sent = []
        for replica in range(self.num_replicas) if replicas is None else replicas:
            request_id = self._send(replica, p.LoadAdapterRequest(adapter.adapter_id, adapter.name, adapter.path))
            self._pending[(replica, request_id)] = adapter.name
            adapter.waiting.add(replica)
            sent.append((replica, request_id))
        return sent

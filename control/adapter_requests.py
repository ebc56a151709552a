"""The control server's requests about LoRA adapters: list (any client), add and remove (the operator).

An add is answered once the inference process has loaded the folder (a handler that returns
``LATER``); the adapters themselves, their ids and their store are :mod:`oven.control.runtime.adapters`.
"""

from __future__ import annotations

from pathlib import Path

from oven.proto import control as c

from .adapter_store import AdapterStoreError
from .requests import LATER, Caller, RequestFailed
from .runtime.adapters import FAILED, Adapter, AdapterUnavailable


class AdapterRequests:
    """Part of ``ControlServer`` (it supplies ``loop``, ``_operator_only`` and ``_reply_later``)."""

    def _list_adapters(self, _caller, _req) -> c.AdapterList:
        return c.AdapterList([_adapter_entry(a) for a in self.loop.adapters.entries()])

    def _add_adapter(self, caller: Caller, req: c.AddAdapter):
        self._operator_only(caller, "add adapters")
        folder = Path(req.path)
        if not folder.is_absolute():
            raise RequestFailed("bad_adapter", f"{req.path}: give the folder as an absolute path on the server's "
                                               "machine")
        reply = self._reply_later()

        def loaded(adapter: Adapter) -> None:
            if adapter.state == FAILED:  # the inference process names the store's copy: name the caller's
                reply(c.ControlError("bad_adapter", adapter.error.replace(adapter.path, str(folder))))
            else:
                reply(_adapter_entry(adapter))
        try:
            self.loop.adapters.add(req.name, folder, loaded)
        except (AdapterStoreError, AdapterUnavailable) as exc:
            raise RequestFailed("bad_adapter", str(exc)) from None
        return LATER

    def _remove_adapter(self, caller: Caller, req: c.RemoveAdapter) -> c.Ok:
        self._operator_only(caller, "remove adapters")
        try:
            self.loop.adapters.remove(req.name)
        except AdapterStoreError as exc:
            raise RequestFailed("bad_adapter", str(exc)) from None
        return c.Ok()


def _adapter_entry(adapter: Adapter) -> c.AdapterEntry:
    info = adapter.info
    return c.AdapterEntry(adapter.name, adapter.adapter_id, adapter.state, adapter.error, adapter.packaged,
                          info.rank if info else 0, list(info.target_modules) if info else [],
                          info.num_params if info else 0)

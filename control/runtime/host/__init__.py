"""Host functions of the ``oven:inferlet`` WIT world that the control process answers, one module per
interface.

A runner (``control/runner/``) runs the guest and answers what needs nothing of the control process
itself (futures' values, identity, clocks, tokenize); every other call it records, and the control
loop applies it here, in the guest's order, on the calling
:class:`~oven.control.runtime.instance.Instance` (``apply.py``). Beyond that instance these functions
use only its ``host`` (:class:`~oven.control.runtime.services.HostServices`). A Python exception raised
here kills the calling instance only; an error the inferlet may handle travels back in a future or a
``result``.
"""

from __future__ import annotations

from collections.abc import Callable

from oven.proto import runner as r

from . import adapters, children, embeds, forward, futures, grammars, http, kvpages, messaging, queues, runtime

INTERFACES: dict[str, dict[str, Callable]] = {
    "futures": futures.FUNCS,
    "runtime": runtime.FUNCS,
    "messaging": messaging.FUNCS,
    "http": http.FUNCS,
    "children": children.FUNCS,
    "queues": queues.FUNCS,
    "kvpages": kvpages.FUNCS,
    "embeds": embeds.FUNCS,
    "adapters": adapters.FUNCS,
    "forward": forward.FUNCS,
    "grammars": grammars.FUNCS,
}

# What the guest gets back at once from a call answered here (the runner gives it before the call is
# applied, proto/runner.py): nothing, a queue id, the call's own value (the runner asks for it then and
# there), or, for every other call, the handle of the future it creates.
_REPLIES = {
    "discard": r.REPLY_NONE, "set-exit-code": r.REPLY_NONE, "pause-hint": r.REPLY_NONE, "send": r.REPLY_NONE,
    "broadcast": r.REPLY_NONE, "destroy-queue": r.REPLY_NONE, "set-priority": r.REPLY_NONE,
    "create-queue": r.REPLY_QUEUE,
    # answered in the runner (control/runner/grammars.py), which reports them with the handle it gave
    **dict.fromkeys(("create-grammar", "drop-grammar", "create-decoder", "drop-decoder"), r.REPLY_NONE),
    **dict.fromkeys(("export-kvpages", "import-kvpages", "release-export", "set-recomputable", "restore-discarded",
                     "save-snapshot", "open-snapshot", "snapshot-tokens", "match-snapshot", "drop-snapshot",
                     "open-adapter", "launch", "cancel-child"), r.REPLY_VALUE),
}

CALL_SPECS = [r.CallSpec(interface, name, _REPLIES.get(name, r.REPLY_FUTURE))
              for interface, funcs in INTERFACES.items() for name in funcs]

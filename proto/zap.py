"""The ZAP handler (RFC 27) of a process's server sockets: admits CURVE clients by key and names them.

Only a process that serves (the control server, the inference server) starts one; :class:`~oven.proto.auth.Admission`
imports this module when a server socket is made, so clients never load pyzmq's thread authenticator.
"""

from __future__ import annotations

import itertools
import threading
from typing import TYPE_CHECKING

import zmq
from zmq.auth.base import VERSION as ZAP_VERSION
from zmq.auth.thread import ThreadAuthenticator
from zmq.utils import z85

if TYPE_CHECKING:
    from .auth import Admission


class ZapHandler(ThreadAuthenticator):
    """One ZAP handler per context, answering for every server socket (domain) in it.

    It also names each connection it admits for the ROUTER: a ZAP reply's ``Identity`` property
    replaces the routing id the peer chose (ZMQ_ROUTING_ID). A peer's own id must not reach a ROUTER:
    libzmq gives id-less peers ``0x00`` + a counter that starts at the same value in every process
    (rand() is never seeded), and a ROUTER that auto-assigns an id a peer already chose aborts the
    whole process (``Assertion failed: ok (src/socket_base.cpp:2113)``). ROUTER_HANDOVER does not
    help: it covers a chosen id meeting a chosen id, not an assigned one. Ours never start with 0x00,
    so they meet neither libzmq's nor each other. (A reply that is back before libzmq has read the
    peer's handshake metadata loses to the peer's id: a rare race, for which the control server
    seeds the counter.)
    """

    def __init__(self, ctx: zmq.Context):
        super().__init__(ctx)
        self.admissions: dict[str, Admission] = {}
        self._last_name = ""
        self._routing_ids = itertools.count(1)

    async def _authenticate_curve(self, domain: str, client_key: bytes) -> tuple[bool, bytes]:
        admission = self.admissions.get(domain)
        name = admission.clients.get(z85.encode(client_key)) if admission else None
        self._last_name = name or ""  # read by curve_user_id right after, on this same thread
        return (True, b"OK") if name else (False, b"Unknown key")

    def curve_user_id(self, client_public_key: bytes) -> str:
        return self._last_name

    def _send_zap_reply(self, request_id: bytes, status_code: bytes, status_text: bytes, user_id: str = "") -> None:
        """pyzmq's reply (RFC 27), with a routing id of ours in its metadata when the peer is admitted."""
        metadata = user = b""
        if status_code == b"200":
            user = user_id.encode()
            routing_id = b"\x01" + next(self._routing_ids).to_bytes(8, "big")
            metadata = bytes([8]) + b"Identity" + len(routing_id).to_bytes(4, "big") + routing_id  # ZMTP property
        self.zap_socket.send_multipart([ZAP_VERSION, request_id, status_code, status_text, user, metadata])


_HANDLERS: dict[int, ZapHandler] = {}
_HANDLERS_LOCK = threading.Lock()


def handler_for(ctx: zmq.Context) -> ZapHandler:
    """The one started ZAP handler of ``ctx``."""
    with _HANDLERS_LOCK:
        auth = _HANDLERS.get(id(ctx))
        if auth is None:
            auth = _HANDLERS[id(ctx)] = ZapHandler(ctx)
            auth.start()
        return auth

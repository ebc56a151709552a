"""Who may talk to an oven server: CurveZMQ keys, tokens, and the ZAP check on the server side.

Every oven socket that accepts peers (the control server, the inference server) is a
CURVE server: traffic is encrypted, a client must prove the server's public key (so a
process squatting an endpoint cannot pose as the server), and the server admits a
client only if its public key is known, through a ZAP handler (RFC 27) that also names
the client: that name arrives with every message as its ``User-Id``.

A *token* is what a client holds: its own secret key and the public key of the server
it may talk to, as one string (``oven-<server public hex>-<client secret hex>``), so
one line in a file, an environment variable or an HTTP ``Authorization`` header is all
a client needs. The server keeps only public keys.
"""

from __future__ import annotations

import itertools
import os
import re
import threading
from dataclasses import dataclass
from pathlib import Path

import zmq
from zmq.auth.base import VERSION as ZAP_VERSION
from zmq.auth.thread import ThreadAuthenticator
from zmq.utils import z85

TOKEN_PREFIX = "oven-"
_TOKEN = re.compile(r"^oven-([0-9a-f]{64})-([0-9a-f]{64})$")
IDENTITY_NAME = re.compile(r"^[a-z][a-z0-9_-]{0,31}$")
OPERATOR = "operator"


class AuthError(ValueError):
    pass


def default_cache_dir() -> Path:
    return Path(os.environ.get("OVEN_CACHE_DIR") or Path.home() / ".cache" / "oven")


def default_state_dir() -> Path:
    """Where a server keeps its keys, its client list, the operator's token and its default socket."""
    return default_cache_dir() / "server"


def default_control_endpoint() -> str:
    return f"ipc://{default_state_dir() / 'control.sock'}"


def private_dir(path: Path) -> Path:
    """``path`` as a directory only its owner can enter (created 0700; a looser one is tightened).

    Refuses a directory owned by someone else: their files could be anything.
    """
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    info = path.stat()
    if info.st_uid != os.getuid():
        raise AuthError(f"{path} belongs to another user (uid {info.st_uid})")
    if info.st_mode & 0o077:
        path.chmod(0o700)
    return path


@dataclass(frozen=True, slots=True)
class Keypair:
    public: bytes  # z85, 40 bytes
    secret: bytes

    @classmethod
    def generate(cls) -> "Keypair":
        public, secret = zmq.curve_keypair()
        return cls(public, secret)

    @classmethod
    def from_secret(cls, secret: bytes) -> "Keypair":
        return cls(zmq.curve_public(secret), secret)


@dataclass(frozen=True, slots=True)
class Token:
    server_public: bytes  # z85
    client: Keypair

    @classmethod
    def parse(cls, text: str) -> "Token":
        match = _TOKEN.match(text.strip())
        if not match:
            raise AuthError("not an oven token (expected oven-<64 hex digits>-<64 hex digits>)")
        server, secret = (z85.encode(bytes.fromhex(part)) for part in match.groups())
        return cls(server, Keypair.from_secret(secret))

    def __str__(self) -> str:
        return f"{TOKEN_PREFIX}{z85.decode(self.server_public).hex()}-{z85.decode(self.client.secret).hex()}"


def write_private_file(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` readable by its owner only, atomically (no moment with looser rights)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def secure_client(sock: zmq.Socket, token: Token) -> None:
    """Make ``sock`` (before connect) a CURVE client that talks only to the token's server."""
    sock.curve_serverkey = token.server_public
    sock.curve_publickey = token.client.public
    sock.curve_secretkey = token.client.secret


def secure_server(sock: zmq.Socket, keys: Keypair, admitted: "Admission") -> None:
    """Make ``sock`` (before bind) a CURVE server whose peers ``admitted`` checks.

    ZAP_ENFORCE_DOMAIN: if no ZAP handler answered, libzmq would admit every client
    that knows the server key; enforcing the domain refuses them instead.
    """
    sock.zap_domain = admitted.domain.encode()
    sock.setsockopt(zmq.ZAP_ENFORCE_DOMAIN, 1)
    sock.curve_server = True
    sock.curve_secretkey = keys.secret
    sock.curve_publickey = keys.public


def user_id(frame: zmq.Frame) -> str | None:
    """The name ZAP gave the peer that sent ``frame`` (received with ``copy=False``).

    None for a peer that had no handshake: only an ``inproc`` peer, that is code of this very
    process, can be one (over ipc and tcp a CURVE server admits no one without ZAP's answer).
    """
    try:
        return frame.get("User-Id")
    except zmq.ZMQError:
        return None


class Admission:
    """The clients one server socket admits: public key (z85) -> name, replaceable at any time."""

    _ids = itertools.count()

    def __init__(self, ctx: zmq.Context, clients: dict[bytes, str]):
        self.domain = f"oven-{os.getpid()}-{next(Admission._ids)}"
        self.clients = dict(clients)
        self._authenticator = _authenticator(ctx)
        self._authenticator.admissions[self.domain] = self

    def update(self, clients: dict[bytes, str]) -> None:
        self.clients = dict(clients)  # one assignment: the ZAP thread sees the old map or the new one

    def close(self) -> None:
        self._authenticator.admissions.pop(self.domain, None)


class _Authenticator(ThreadAuthenticator):
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


_AUTHENTICATORS: dict[int, _Authenticator] = {}
_AUTHENTICATORS_LOCK = threading.Lock()


def _authenticator(ctx: zmq.Context) -> _Authenticator:
    with _AUTHENTICATORS_LOCK:
        auth = _AUTHENTICATORS.get(id(ctx))
        if auth is None:
            auth = _AUTHENTICATORS[id(ctx)] = _Authenticator(ctx)
            auth.start()
        return auth


# A control process hands the inference process it starts a fresh key pair and the one client key to
# admit, in the child's environment (which only the same user can read), not on its command line.
INFERENCE_KEYS_ENV = "OVEN_INFERENCE_KEYS"


def inference_keys_env(server: Keypair, client_public: bytes) -> dict[str, str]:
    return {INFERENCE_KEYS_ENV: f"{z85.decode(server.secret).hex()}:{z85.decode(client_public).hex()}"}


def take_inference_keys() -> tuple[Keypair, bytes] | None:
    """(server keys, the admitted client's public key) from the environment, removed from it; None if unset."""
    text = os.environ.pop(INFERENCE_KEYS_ENV, None)
    if not text:
        return None
    secret, client = text.split(":")
    return Keypair.from_secret(z85.encode(bytes.fromhex(secret))), z85.encode(bytes.fromhex(client))

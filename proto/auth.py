"""Who may talk to an oven server: CurveZMQ keys, tokens, and the ZAP check on the server side.

Every oven socket that accepts peers (the control server, the inference server) is a
CURVE server: traffic is encrypted, a client must prove the server's public key (so a
process squatting an endpoint cannot pose as the server), and the server admits a
client only if its public key is known, through a ZAP handler (RFC 27, ``zap.py``, which only
serving processes load) that also names the client: that name arrives with every message as its ``User-Id``.

A *token* is what a client holds: its own secret key and the public key of the server
it may talk to, as one string (``oven-<server public hex>-<client secret hex>``), so
one line in a file, an environment variable or an HTTP ``Authorization`` header is all
a client needs. The server keeps only public keys.
"""

from __future__ import annotations

import functools
import grp
import itertools
import os
import pwd
import re
import stat
from dataclasses import dataclass
from pathlib import Path

import zmq
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


class UnsafePath(AuthError):
    """A folder or file that another local user could have written, refused; the message is one line."""


def check_path(path: Path, setting: str = "folder", *, entries: bool = False) -> Path:
    """``path`` made absolute, if no one but this user and root could have written it: UnsafePath otherwise.

    ssh's StrictModes, along the whole path from ``/``: every part that exists is owned by this user or
    root, and no group or other user may write it (a group with no member but this user and root does
    not count, as Debian's sshd allows for user private groups). A folder *above* ``path`` may also be
    a root-owned sticky one such as /tmp, where no one may rename or remove another's entries.
    Symbolic links are followed, and the parts of their targets checked the same way. Parts that do not
    exist are not checked: whoever creates them checks again. ``entries``: of a folder, check what is
    directly in it too (a model's or an adapter's files). ``setting`` names what chose ``path``, for the
    message (``... or choose another state_dir``).
    """
    path = Path(path).absolute()
    _check_parts(path, path, setting, leaf=True, links=0)
    if entries and path.is_dir():
        for entry in path.iterdir():
            _check_parts(entry, entry, setting, leaf=True, links=0)
    return path


def private_dir(path: Path, setting: str = "folder") -> Path:
    """``path`` as a directory only its owner can enter (created 0700; one that others may only read is
    tightened), after :func:`check_path`: a folder another user could have written, or whose parent
    they could write (and so rename it away), is refused, as one owned by someone else: its files
    could be anything.
    """
    check_path(path, setting)
    for parent in reversed(path.parents):  # created 0755 (less by the umask), never open to others
        if not parent.exists():
            parent.mkdir(mode=0o755, exist_ok=True)
    path.mkdir(mode=0o700, exist_ok=True)
    check_path(path, setting)  # what was made, or found made by someone faster
    info = path.stat()
    if info.st_uid != os.geteuid():
        raise UnsafePath(f"refusing {path}: it belongs to {_user(info.st_uid)}, not to you (choose another "
                         f"{setting})")
    if info.st_mode & 0o077:
        path.chmod(0o700)
    return path


def _check_parts(path: Path, shown: Path, setting: str, leaf: bool, links: int) -> None:
    """Check each existing part of the absolute ``path`` (see :func:`check_path`); ``shown`` is what the
    caller asked about, ``leaf`` whether ``path``'s last part is it (not a folder above it)."""
    parts = path.parts
    for i in range(1, len(parts) + 1):
        part = Path(*parts[:i])
        is_leaf = leaf and i == len(parts)
        try:
            info = os.lstat(part)
        except OSError:  # not there, or out of this user's reach: nothing of it can be read either
            return
        if stat.S_ISLNK(info.st_mode):  # who owns the link says where it points; then its target's parts
            if links >= 40:
                raise UnsafePath(f"refusing {shown}: too many symbolic links")
            _check_owner(info, part, shown, setting)
            _check_parts(Path(os.path.realpath(part)), shown, setting, is_leaf, links + 1)
            continue
        _check_owner(info, part, shown, setting)
        writers = info.st_mode & (stat.S_IWGRP | stat.S_IWOTH)
        if writers & stat.S_IWGRP and _harmless_group(info.st_gid):
            writers &= ~stat.S_IWGRP
        if not writers or (not is_leaf and info.st_uid == 0 and stat.S_ISDIR(info.st_mode)
                           and info.st_mode & stat.S_ISVTX):
            continue
        who = {stat.S_IWGRP: "group", stat.S_IWOTH: "others"}.get(writers, "group and others")
        fix = {stat.S_IWGRP: "g-w", stat.S_IWOTH: "o-w"}.get(writers, "go-w")
        where = "" if part == shown else f"{part} is "
        raise UnsafePath(f"refusing {shown}: {where}writable by {who} (chmod {fix} {part}, or choose another "
                         f"{setting})")


def _check_owner(info: os.stat_result, part: Path, shown: Path, setting: str) -> None:
    if info.st_uid not in (0, os.geteuid()):
        where = "it" if part == shown else str(part)
        raise UnsafePath(f"refusing {shown}: {where} belongs to {_user(info.st_uid)}, neither you nor root "
                         f"(choose another {setting})")


def _user(uid: int) -> str:
    try:
        return f"{pwd.getpwuid(uid).pw_name} (uid {uid})"
    except KeyError:
        return f"uid {uid}"


@functools.cache
def _harmless_group(gid: int) -> bool:
    """Whether no one but this user and root is in group ``gid`` (as a member or by their primary group)."""
    trusted = {0, os.geteuid()}
    try:
        names = {pwd.getpwuid(uid).pw_name for uid in trusted}
        members = grp.getgrgid(gid).gr_mem
    except KeyError:
        return False
    return set(members) <= names and all(user.pw_uid in trusted for user in pwd.getpwall() if user.pw_gid == gid)


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
    """Write ``text`` to ``path`` readable by its owner only, atomically: ``path`` holds the old text or the
    new one, with no moment of looser rights, and a failure (a full disk) leaves no temporary file."""
    write_atomically(path, text.encode(), 0o600, f".{path.name}.{os.getpid()}.tmp")


def write_atomically(path: Path, data: bytes, mode: int, tmp_name: str) -> None:
    """Write ``data`` to the file ``tmp_name`` beside ``path`` (created ``mode``), sync it to disk and
    rename it over ``path``; on any failure the temporary file is removed and ``path`` is as it was."""
    tmp = path.with_name(tmp_name)
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, mode)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


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
        from .zap import handler_for  # server side only: the thread authenticator brings asyncio (60 ms a CLI verb)

        self._authenticator = handler_for(ctx)
        self._authenticator.admissions[self.domain] = self

    def update(self, clients: dict[bytes, str]) -> None:
        self.clients = dict(clients)  # one assignment: the ZAP thread sees the old map or the new one

    def close(self) -> None:
        self._authenticator.admissions.pop(self.domain, None)


# A control process hands the inference process it starts a fresh key pair and the one client key to
# admit, in the child's environment (which only the same user can read), not on its command line.
INFERENCE_KEYS_ENV = "OVEN_INFERENCE_KEYS"


def inference_keys_env(server: Keypair, client_public: bytes) -> dict[str, str]:
    return {INFERENCE_KEYS_ENV: f"{z85.decode(server.secret).hex()}:{z85.decode(client_public).hex()}"}


JOIN_PREFIX = "oven-inference-"


def join_keys(path: Path) -> tuple[Keypair, Token]:
    """An inference process's keys for a control process on another host (``oven inference --join``):
    (its own key pair, the token the control side connects with, whose client key is the one it admits).
    Kept in ``path`` (created readable by its owner only, reused when it exists), so a restarted process
    admits the same control side. AuthError for a file that is not such keys."""
    if path.exists():
        match = re.fullmatch(re.escape(JOIN_PREFIX) + r"([0-9a-f]{64})-([0-9a-f]{64})", path.read_text().strip())
        if not match:
            raise AuthError(f"{path} holds no inference keys (expected {JOIN_PREFIX}<64 hex digits>-<64 hex digits>)")
        server, client = (Keypair.from_secret(z85.encode(bytes.fromhex(part))) for part in match.groups())
    else:
        server, client = Keypair.generate(), Keypair.generate()
        write_private_file(path, f"{JOIN_PREFIX}{z85.decode(server.secret).hex()}-{z85.decode(client.secret).hex()}\n")
    return server, Token(server.public, client)


def take_inference_keys() -> tuple[Keypair, bytes] | None:
    """(server keys, the admitted client's public key) from the environment, removed from it; None if unset."""
    text = os.environ.pop(INFERENCE_KEYS_ENV, None)
    if not text:
        return None
    secret, client = text.split(":")
    return Keypair.from_secret(z85.encode(bytes.fromhex(secret))), z85.encode(bytes.fromhex(client))

"""A control server's keys and the clients it admits, kept in its private state directory.

* ``server.key`` - the server's CURVE secret key (its public key is in every token);
* ``clients.json`` - name -> public key (hex);
* ``operator.token`` - the token of the identity ``operator``, created at first start,
  which the ``oven`` CLI of the same user reads, so the server's owner needs no setup.

All three are 0600 in a 0700 directory that no other user could have written (``private_dir``);
the server keeps no client secret but the operator's. A change of clients is written to a temporary
file, synced and renamed over the old one, and taken in memory only then: on a full disk it fails
whole. The operator may act on every client's instances, exports and programs, publish programs to
the shared library, and add or remove clients (``oven token``).
"""

from __future__ import annotations

import json
from pathlib import Path

from zmq.utils import z85

from oven.proto.auth import IDENTITY_NAME, OPERATOR, AuthError, Keypair, Token, private_dir, write_private_file


class Keyring:
    def __init__(self, state_dir: Path):
        self.dir = private_dir(Path(state_dir), "state_dir")
        key_file = self.dir / "server.key"
        if key_file.exists():
            self.server = Keypair.from_secret(key_file.read_bytes().strip())
        else:
            self.server = Keypair.generate()
            write_private_file(key_file, self.server.secret.decode())
        self._clients_file = self.dir / "clients.json"
        self._clients: dict[str, dict] = (json.loads(self._clients_file.read_text())
                                          if self._clients_file.exists() else {})
        token_file = self.dir / "operator.token"
        if OPERATOR not in self._clients or not token_file.exists() or not self._operator_token_valid(token_file):
            self._clients.pop(OPERATOR, None)
            write_private_file(token_file, str(self.add(OPERATOR)) + "\n")

    def _operator_token_valid(self, token_file: Path) -> bool:
        try:
            token = Token.parse(token_file.read_text())
        except AuthError:
            return False
        entry = self._clients[OPERATOR]
        return token.server_public == self.server.public and entry["public"] == _hex(token.client.public)

    def add(self, name: str) -> Token:
        """A new client ``name``; its token (shown once: the server keeps only the public key)."""
        if not IDENTITY_NAME.match(name):
            raise AuthError(f"a client name is a lowercase letter, then up to 31 of a-z 0-9 _ -; not {name!r}")
        if name in self._clients:
            raise AuthError(f"a client named {name!r} exists (remove it first)")
        keys = Keypair.generate()
        self._save({**self._clients, name: {"public": _hex(keys.public)}})
        return Token(self.server.public, keys)

    def remove(self, name: str) -> None:
        if name == OPERATOR:
            raise AuthError("the operator cannot be removed")
        if name not in self._clients:
            raise AuthError(f"no client named {name!r}")
        self._save({other: entry for other, entry in self._clients.items() if other != name})

    def names(self) -> list[str]:
        return sorted(self._clients)

    def __contains__(self, name: str) -> bool:
        """Whether client ``name`` is admitted now (the operator always is)."""
        return name in self._clients

    def admitted(self) -> dict[bytes, str]:
        """Public key (z85) -> client name, for the ZAP handler."""
        return {z85.encode(bytes.fromhex(entry["public"])): name for name, entry in self._clients.items()}

    def _save(self, clients: dict[str, dict]) -> None:
        """``clients`` on disk, then in memory: a failure (a full disk) changes neither."""
        write_private_file(self._clients_file, json.dumps(clients, indent=1, sort_keys=True))
        self._clients = clients


def _hex(z85_key: bytes) -> str:
    return z85.decode(z85_key).hex()

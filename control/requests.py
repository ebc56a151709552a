"""What the control server's request handlers share: the caller, a refusal, a reply that comes later."""

from __future__ import annotations

from dataclasses import dataclass

from oven.proto import control as c
from oven.proto.auth import OPERATOR

LATER = object()  # a handler's return value: the reply is sent later, through _reply_later()


class RequestFailed(Exception):
    def __init__(self, code: str, message: str):
        super().__init__(message)
        self.reply = c.ControlError(code, message)


@dataclass(frozen=True, slots=True)
class Caller:
    route: bytes  # the ZeroMQ routing id: one connection, which holds the lease
    name: str  # the client it authenticated as

    @property
    def operator(self) -> bool:
        return self.name == OPERATOR

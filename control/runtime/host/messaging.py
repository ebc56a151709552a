"""``messaging``: to and from the client, and broadcast/subscribe between instances."""

from __future__ import annotations

from .. import futures as f


# One message to the client, in UTF-8 bytes: what a client that reads slowly makes the server hold is
# counted in bytes (control/server.py), and a message is a frame that cannot be sent in parts.
MAX_MESSAGE_BYTES = 1 << 20


def send(inst, message: str) -> None:
    if len(message) > MAX_MESSAGE_BYTES // 4:  # a character is at most 4 bytes: shorter ones fit
        size = len(message.encode())
        if size > MAX_MESSAGE_BYTES:
            raise ValueError(f"send: a message is at most {MAX_MESSAGE_BYTES >> 20} MiB, this one is "
                             f"{size / (1 << 20):.1f} MiB (send it in parts)")
    inst.keep_for_parent(message)  # a child's (runtime/children.py)
    inst.host.emit(inst, "message", message)


def receive(inst) -> int:
    fut = inst.futures.create(f.TEXT, io=True)
    inst.inbox.wait(lambda text: inst.futures.complete(fut, text))
    return fut.handle


# Topics are per client, like export names: one client's inferlets never hear another's.
def broadcast(inst, topic: str, message: str) -> None:
    inst.host.topics.publish((inst.owner, topic), message)


def subscribe(inst, topic: str) -> int:
    fut = inst.futures.create(f.TEXT, io=True)
    inst.host.topics.wait(inst.instance_id, (inst.owner, topic), lambda text: inst.futures.complete(fut, text))
    return fut.handle


FUNCS = {"send": send, "receive": receive, "broadcast": broadcast, "subscribe": subscribe}

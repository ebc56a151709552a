"""``messaging``: to and from the client, and broadcast/subscribe between instances."""

from __future__ import annotations

from .. import futures as f


def send(inst, message: str) -> None:
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

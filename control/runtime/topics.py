"""Broadcast/subscribe between instances: a subscription is one future for the next message."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Hashable
from typing import Callable


class Topics:
    def __init__(self):
        self._waiters: dict[Hashable, list[tuple[str, Callable[[str], None]]]] = defaultdict(list)

    def wait(self, instance_id: str, topic: Hashable, deliver: Callable[[str], None]) -> None:
        self._waiters[topic].append((instance_id, deliver))

    def publish(self, topic: Hashable, message: str) -> int:
        """Deliver to every instance waiting on ``topic``; return how many got it."""
        waiters = self._waiters.pop(topic, [])
        for _, deliver in waiters:
            deliver(message)
        return len(waiters)

    def forget(self, instance_id: str) -> None:
        for topic in list(self._waiters):
            self._waiters[topic] = [w for w in self._waiters[topic] if w[0] != instance_id]
            if not self._waiters[topic]:
                del self._waiters[topic]

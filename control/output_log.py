"""What each instance wrote, kept so that a client attaching later sees it from the start (``oven attach``).

The log holds the encoded :class:`~oven.proto.control.InstanceEvent` frames of an instance, its
exit last, while the instance runs or is among the ended ones ``oven ps`` shows. Each log keeps
at most ``max_bytes``: past that its oldest frames go, and a replay starts with a note saying so.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

from oven.proto import control as c

REPLAY_BYTES = 256 << 10


class OutputLog:
    def __init__(self, max_bytes: int = REPLAY_BYTES):
        self.max_bytes = max_bytes
        self._frames: dict[str, deque[bytes]] = {}
        self._num_bytes: dict[str, int] = {}
        self._dropped: dict[str, int] = {}  # instance id -> bytes of output no longer kept

    def record(self, instance_id: str, frame: bytes) -> None:
        frames = self._frames.setdefault(instance_id, deque())
        frames.append(frame)
        size = self._num_bytes.get(instance_id, 0) + len(frame)
        while size > self.max_bytes and len(frames) > 1:
            size -= len(old := frames.popleft())
            self._dropped[instance_id] = self._dropped.get(instance_id, 0) + len(old)
        self._num_bytes[instance_id] = size

    def replay(self, instance_id: str) -> list[bytes]:
        """The frames to send a client that attaches now (oldest first)."""
        frames = list(self._frames.get(instance_id, ()))
        dropped = self._dropped.get(instance_id)
        if dropped:
            note = c.InstanceEvent(instance_id, "stderr", f"[oven: the first {dropped} bytes of output are no "
                                                          "longer kept]\n")
            frames.insert(0, c.CODEC.encode(note))
        return frames

    def keep_only(self, wanted: Callable[[str], bool]) -> None:
        """Forget the logs of instances ``wanted`` says no to (gone from ``oven ps``)."""
        for instance_id in [i for i in self._frames if not wanted(i)]:
            del self._frames[instance_id]
            self._num_bytes.pop(instance_id, None)
            self._dropped.pop(instance_id, None)

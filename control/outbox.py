"""Frames for the control server's clients, delivered in order at the pace each client reads.

ZeroMQ's ROUTER drops a frame silently when the pipe to its client is full. A
client that stopped reading for a few seconds while an inferlet printed would
lose output, the exit event and the replies to its own requests, and then wait
for them forever. So the server's socket is ROUTER_MANDATORY: a full pipe raises
``zmq.Again`` instead, and the frame waits here behind the client's earlier ones
until :meth:`ClientOutbox.flush` finds room. What waits is the server's to bound,
in bytes: it holds back the slices of instances whose watchers are behind
(``ControlServer``), and forgets a client whose unread bytes pass a hard limit.

ZeroMQ bounds its pipe in frames, not bytes (``SNDHWM``), so the server keeps that
pipe short and counts what sits in it: the pipe of a client with frames waiting
here is full, and a pipe of ``pipe_frames`` frames holds at most the last
``pipe_frames`` frames handed to it (one more is in the I/O thread's hands).
:meth:`ClientOutbox.unread_bytes` adds their sizes to those of the frames waiting.
"""

from __future__ import annotations

from collections import deque

import zmq


class Backlog:
    """The frames one client's pipe had no room for, oldest first."""

    __slots__ = ("frames", "num_bytes")

    def __init__(self):
        self.frames: deque[bytes] = deque()
        self.num_bytes = 0


class _Handed:
    """Sizes of the last frames handed to ZeroMQ for one client: what its pipe may still hold."""

    __slots__ = ("sizes", "num_bytes")

    def __init__(self, capacity: int):
        self.sizes: deque[int] = deque(maxlen=capacity)
        self.num_bytes = 0

    def add(self, size: int) -> None:
        if len(self.sizes) == self.sizes.maxlen:
            self.num_bytes -= self.sizes[0]  # the append below pushes it out
        self.sizes.append(size)
        self.num_bytes += size


class ClientOutbox:
    """``sock``: the server's ROUTER, whose ``SNDHWM`` the outbox sets to ``pipe_frames`` (before it binds:
    a pipe takes the option when its peer connects)."""

    def __init__(self, sock: zmq.Socket, pipe_frames: int):
        sock.setsockopt(zmq.ROUTER_MANDATORY, 1)
        sock.setsockopt(zmq.SNDHWM, pipe_frames)
        self.sock, self._pipe_frames = sock, pipe_frames
        self.backlogs: dict[bytes, Backlog] = {}  # only clients with frames waiting (read only outside)
        self._handed: dict[bytes, _Handed] = {}

    def send(self, client: bytes, frame: bytes) -> None:
        """Send ``frame`` to ``client`` now, or queue it (behind anything already waiting for that client)."""
        backlog = self.backlogs.get(client)
        if backlog is None:
            if self._try_send(client, frame) is not _FULL:
                return
            backlog = self.backlogs[client] = Backlog()
        backlog.frames.append(frame)
        backlog.num_bytes += len(frame)

    def flush(self) -> None:
        """Send what waits, for each client until its pipe is full again."""
        for client, backlog in list(self.backlogs.items()):
            frames = backlog.frames
            while frames:
                outcome = self._try_send(client, frames[0])
                if outcome is _FULL:
                    break
                if outcome is _GONE:
                    frames.clear()
                else:
                    backlog.num_bytes -= len(frames.popleft())
            if not frames:
                del self.backlogs[client]

    def unread_bytes(self, client: bytes) -> int:
        """Bytes for ``client`` held in this process while its pipe is full (0 while it has room): the frames
        waiting here and those in the pipe."""
        backlog = self.backlogs.get(client)
        if backlog is None:
            return 0
        handed = self._handed.get(client)
        return backlog.num_bytes + (handed.num_bytes if handed is not None else 0)

    def forget(self, client: bytes) -> None:
        self.backlogs.pop(client, None)
        self._handed.pop(client, None)

    def _try_send(self, client: bytes, frame: bytes) -> str:
        try:
            self.sock.send_multipart([client, frame], zmq.NOBLOCK)
        except zmq.Again:
            return _FULL
        except zmq.ZMQError as exc:
            if exc.errno != zmq.EHOSTUNREACH:
                raise
            self._handed.pop(client, None)
            return _GONE  # disconnected: nobody will read its frames
        handed = self._handed.get(client)
        if handed is None:
            handed = self._handed[client] = _Handed(self._pipe_frames + 1)
        handed.add(len(frame))
        return _SENT


_SENT, _FULL, _GONE = "sent", "full", "gone"

"""Frames for the control server's clients, delivered in order at the pace each client reads.

ZeroMQ's ROUTER drops a frame silently when the pipe to its client is full (1000
frames by default). A client that stopped reading for a few seconds while an
inferlet printed would lose output, the exit event and the replies to its own
requests, and then wait for them forever. So the server's socket is
ROUTER_MANDATORY: a full pipe raises ``zmq.Again`` instead, and the frame waits
here behind the client's earlier ones until :meth:`ClientOutbox.flush` finds
room. What waits is the server's to bound: it holds back the slices of instances
whose watchers are behind (``ControlServer``), and forgets a client whose backlog
passes a hard limit.
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


class ClientOutbox:
    def __init__(self, sock: zmq.Socket):
        sock.setsockopt(zmq.ROUTER_MANDATORY, 1)
        self.sock = sock
        self.backlogs: dict[bytes, Backlog] = {}  # only clients with frames waiting (read only outside)

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

    def forget(self, client: bytes) -> None:
        self.backlogs.pop(client, None)

    def _try_send(self, client: bytes, frame: bytes) -> str:
        try:
            self.sock.send_multipart([client, frame], zmq.NOBLOCK)
        except zmq.Again:
            return _FULL
        except zmq.ZMQError as exc:
            if exc.errno != zmq.EHOSTUNREACH:
                raise
            return _GONE  # disconnected: nobody will read its frames
        return _SENT


_SENT, _FULL, _GONE = "sent", "full", "gone"

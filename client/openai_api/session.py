"""One API request's run of the chat-completion inferlet, on a connection of its own.

The connection authenticates with the request's API key, which is an oven token: the control
server admits (or refuses) it and owns the instance in that client's name, so its quotas,
ownership and lease apply unchanged. The blocking :class:`OvenClient` runs on a thread of the
session's own, which alone touches it; what the inferlet sends reaches the event loop through
an asyncio queue. Closing the session (the HTTP client went away) terminates the instance.
"""

from __future__ import annotations

import asyncio
import json
import threading

from oven.client.rpc import ControlRequestError, OvenClient, ServerRestarted
from oven.proto.auth import AuthError

from .errors import SERVER, ApiError, from_control, not_answering, refused_key

POLL_S = 0.1  # how soon the thread notices that the session was closed
REQUEST_TIMEOUT_S = 30.0


class InferletFailed(Exception):
    """The instance ended with an error or a nonzero status; the message says why."""


class Session:
    """``async for message in session`` gives the inferlet's JSON messages in order; raises
    :class:`ApiError` for a refused key or launch and :class:`InferletFailed` if the run fails."""

    def __init__(self, endpoint: str, api_key: str, program: str, args: list[str]):
        self._endpoint, self._api_key, self._program, self._args = endpoint, api_key, program, args
        self._loop = asyncio.get_running_loop()
        self._queue: asyncio.Queue = asyncio.Queue()
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="oven-openai-session")
        self._thread.start()

    def close(self) -> None:
        """Stop listening; an instance still running is terminated (by the session's thread)."""
        self._closed.set()

    async def __aiter__(self):
        try:
            while True:
                item = await self._queue.get()
                if item is None:
                    return
                if isinstance(item, Exception):
                    raise item
                yield item
        finally:
            self.close()

    def _put(self, item) -> None:
        self._loop.call_soon_threadsafe(self._queue.put_nowait, item)

    def _run(self) -> None:
        try:
            with OvenClient(self._endpoint, timeout_s=REQUEST_TIMEOUT_S, token=self._api_key) as client:
                self._pump(client)
        except AuthError:
            self._put(refused_key())
        except ControlRequestError as exc:
            self._put(from_control(exc))
        except TimeoutError:
            self._put(not_answering())
        except ServerRestarted as exc:
            self._put(ApiError(503, str(exc), SERVER))
        except Exception as exc:  # noqa: BLE001 - a bug here fails this request, not the server
            self._put(ApiError(500, f"{type(exc).__name__}: {exc}", SERVER))
        else:
            self._put(None)

    def _pump(self, client: OvenClient) -> None:
        instance_id = client.launch(self._program, self._args)
        stderr = []
        for event in client.events(poll_s=POLL_S):
            if self._closed.is_set():
                client.terminate(instance_id)
                return
            if event is None or event.instance_id != instance_id:
                continue
            if event.kind == "message":
                self._put(json.loads(event.text))
            elif event.kind == "stderr":
                stderr.append(event.text)
            elif event.kind == "exit":
                if event.text or event.exit_code:
                    last = "".join(stderr).strip().splitlines()[-1:]
                    why = event.text or (last[0] if last else f"exit status {event.exit_code}")
                    self._put(InferletFailed(f"the chat-completion inferlet failed: {why}"))
                return

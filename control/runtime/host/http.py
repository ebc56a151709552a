"""``http``: outbound requests to allow-listed hosts, run off the loop thread."""

from __future__ import annotations

from .. import futures as f


def fetch(inst, method: str, url: str, headers: list[str], body: bytes | list[int]) -> int:
    fut = inst.futures.create(f.HTTP, io=True)
    inst.loop.http.fetch(method, url, headers, bytes(body),
                         on_done=lambda status, data: inst.futures.complete(fut, (status, data)),
                         on_error=lambda message: inst.futures.fail(fut, message))
    return fut.handle


FUNCS = {"fetch": fetch}

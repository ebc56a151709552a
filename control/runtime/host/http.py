"""``http``: outbound requests to allow-listed host:port targets, run off the loop thread (see http_client)."""

from __future__ import annotations

from .. import futures as f


def fetch(inst, method: str, url: str, headers: list[str], body: bytes | list[int]) -> int:
    fut = inst.futures.create(f.HTTP, io=True)
    inst.host.http.fetch(inst.instance_id, method, url, headers, bytes(body),
                         on_done=lambda status, data: inst.futures.complete(fut, (status, data)),
                         on_error=lambda message: inst.futures.fail(fut, message), client=inst.owner)
    return fut.handle


FUNCS = {"fetch": fetch}

"""The executor's inferlet side: send each call out the moment it is written, and turn every
answer, failure and timeout into an interrupt for the interrupt manager.

Transports: the instance's message channel (the client runs the tools), or HTTP (a tool
endpoint that takes ``{"id", "call"}`` and answers with the value as its body).
"""

from __future__ import annotations

import json

import inferlet


class Calls:
    def __init__(self, interrupts, estimate_ms, timeout_ms: int, http_url: str | None = None):
        self.interrupts, self.estimate_ms = interrupts, estimate_ms
        self.timeout_ms, self.http_url = timeout_ms, http_url
        self.in_flight: dict[str, tuple[str, int]] = {}  # call id -> (call, dispatched at in ms)
        self.dispatched = 0

    def dispatch(self, call_id: str, call: str) -> None:
        now = inferlet.now_ms()
        self.in_flight[call_id] = (call, now)
        self.dispatched += 1
        message = {"type": "call", "id": call_id, "call": call, "t": now}
        if self.http_url:  # the client only shows it
            message["via"] = "http"
            inferlet.spawn(self._over_http(call_id, call))
        inferlet.send(json.dumps(message))
        inferlet.spawn(self._deadline(call_id))

    def answer(self, call_id: str, value: str, ok: bool = True) -> None:
        """A result for ``call_id`` (from the client, HTTP or the deadline); later duplicates are ignored."""
        if self.in_flight.pop(call_id, None) is not None:
            self.interrupts.push(call_id, value if ok else f"error: {value}")

    def expected_wait_ms(self) -> int:
        """Until the first in-flight call is expected back, by its estimated execution time."""
        now = inferlet.now_ms()
        # (estimates may be fractional: the client sends what it measured)
        return max(0, round(min((at + self.estimate_ms(call) - now for call, at in self.in_flight.values()),
                                default=0)))

    async def _deadline(self, call_id: str) -> None:
        await inferlet.sleep(self.timeout_ms)
        self.answer(call_id, f"timeout after {self.timeout_ms} ms", ok=False)

    async def _over_http(self, call_id: str, call: str) -> None:
        body = json.dumps({"id": call_id, "call": call}).encode()
        try:
            response = await inferlet.fetch("POST", self.http_url, ["Content-Type: application/json"], body)
        except inferlet.OvenError as exc:
            self.answer(call_id, str(exc), ok=False)
            return
        text = bytes(response.body).decode("utf-8", "replace")
        self.answer(call_id, text if response.status == 200 else f"HTTP {response.status}: {text}",
                    ok=response.status == 200)

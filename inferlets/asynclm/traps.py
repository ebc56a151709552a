"""The trap handler: while the model waits for results, its KV cache is the server's to place, or
kept, offloaded or dropped by an explicit override.

``auto`` (the default) tells the server how long the wait should last (``Context.pause_hint``)
and leaves the rest to its interception policy, which weighs this context against every other
paused and running one (InferCept: keep it on the device, or swap it to the host tier, and have
it back before the model runs). ``keep`` / ``offload`` / ``drop`` decide here instead, for
experiments: ``drop`` evicts the pages and the next forward recomputes every token.
"""

from __future__ import annotations

import inferlet

POLICIES = ("auto", "keep", "offload", "drop")
POOL = "pool"  # the decision reported under ``auto``: the server's interception policy places the KV


class TrapHandler:
    def __init__(self, policy: str, report):
        if policy not in POLICIES:
            raise ValueError(f"kv policy {policy!r} is not one of {', '.join(POLICIES)}")
        self.policy, self.report = policy, report
        self.page_ms_saved = 0  # device pages x milliseconds this inferlet freed itself while waiting

    async def wait(self, ctx, until, expected_wait_ms: int, policy: str | None = None) -> str:
        """Wait for ``until()`` with the KV cache placed by the server, kept, offloaded or dropped;
        ready to forward after."""
        decision = policy or self.policy
        if decision == "auto":
            decision = POOL
            ctx.pause_hint(expected_wait_ms)  # frees the pages allocated ahead, too
        else:
            ctx.free_pages_ahead()  # while waiting, hold no page but those of the K/V
        pages, freed_at = len(ctx.pages), inferlet.now_ms()
        self.report({"type": "kv", "decision": decision, "tokens": len(ctx.tokens), "pages": pages,
                     "expected_wait_ms": expected_wait_ms})
        if decision == "offload":
            await ctx.offload()
        elif decision == "drop":
            ctx.evict()  # the next forward recomputes every token
        await until()
        if decision == "offload":
            await ctx.restore()
        if decision in ("offload", "drop"):
            self.page_ms_saved += pages * (inferlet.now_ms() - freed_at)
        return decision

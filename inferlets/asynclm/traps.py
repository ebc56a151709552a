"""The trap handler: while the model waits for results, keep its KV cache on the device, offload
it to the host tier, or drop it and recompute it on resume — whichever the cost models say.

Recomputing n tokens costs about a*n^2 + b*n (attention is quadratic, the rest linear);
swapping p pages out and back costs about c*p. The coefficients are measured on the running
model and device (``CostModel.profile``), or handed in from an earlier run's summary.
"""

from __future__ import annotations

import inferlet

RECOMPUTE_SIZES = (32, 64, 128, 256)  # tokens prefilled to fit the recompute model
SWAP_PAGES, SWAP_ROUNDS = 16, 5       # pages moved out and back, and how often: enough to take
                                      # many milliseconds in all (the clock counts whole ms)
POLICIES = ("auto", "keep", "offload", "drop")


def _fit(points: list[tuple[float, float, float]]) -> tuple[float, float]:
    """Least squares t = a*x + b*y over (x, y, t), both coefficients clamped at zero."""
    sxx = sum(x * x for x, _, _ in points)
    sxy = sum(x * y for x, y, _ in points)
    syy = sum(y * y for _, y, _ in points)
    sxt = sum(x * t for x, _, t in points)
    syt = sum(y * t for _, y, t in points)
    det = sxx * syy - sxy * sxy
    a = (sxt * syy - syt * sxy) / det if det else 0.0
    b = (syt * sxx - sxt * sxy) / det if det else 0.0
    if a < 0:
        a, b = 0.0, syt / syy
    if b < 0:
        a, b = sxt / sxx, 0.0
    return max(a, 0.0), max(b, 0.0)


class CostModel:
    def __init__(self, coefficients: dict | None = None):
        self.coefficients = dict(coefficients) if coefficients else None  # {"a", "b", "c"} in ms

    def recompute_ms(self, tokens: int) -> float:
        return self.coefficients["a"] * tokens * tokens + self.coefficients["b"] * tokens

    def swap_ms(self, pages: int) -> float:
        return self.coefficients["c"] * pages

    async def profile(self, sample: list[int]) -> None:
        """Time prefills and offload/restore round trips on scratch contexts."""
        recompute = []
        for n in RECOMPUTE_SIZES:
            tokens = (sample * (n // max(len(sample), 1) + 2))[:n + 1]  # a flush forwards all but the last
            best = None
            for _ in range(2):  # the first run of a size may pay for warm-up
                with inferlet.Context() as scratch:
                    scratch.fill_tokens(tokens)
                    start = inferlet.now_ms()
                    await scratch.flush()
                    took = inferlet.now_ms() - start
                    best = took if best is None else min(best, took)
            recompute.append((n * n, n, float(best)))
        with inferlet.Context() as scratch:
            scratch.fill_tokens((sample * SWAP_PAGES * inferlet.page_size())[:SWAP_PAGES * inferlet.page_size()])
            await scratch.flush()
            start = inferlet.now_ms()
            for _ in range(SWAP_ROUNDS):
                await scratch.offload()
                await scratch.restore()
            swap_ms = inferlet.now_ms() - start
        a, b = _fit(recompute)
        self.coefficients = {"a": a, "b": b, "c": swap_ms / (SWAP_PAGES * SWAP_ROUNDS)}


class TrapHandler:
    def __init__(self, policy: str, costs: CostModel, report):
        if policy not in POLICIES:
            raise ValueError(f"kv policy {policy!r} is not one of {', '.join(POLICIES)}")
        self.policy, self.costs, self.report = policy, costs, report
        self.page_ms_saved = 0  # device pages x milliseconds not held while waiting, against keeping

    async def decide(self, ctx, expected_wait_ms: int) -> str:
        if self.policy != "auto":
            return self.policy
        if self.costs.coefficients is None:
            try:
                await self.costs.profile(ctx.tokens[:64] or [0])
            except inferlet.OvenError as exc:  # e.g. no pages to spare for the scratch contexts
                self.policy = "keep"
                self.report({"type": "error", "error": f"trap handler: cannot profile ({exc}); keeping the KV cache"})
                return "keep"
        recompute, swap = self.costs.recompute_ms(len(ctx.tokens)), self.costs.swap_ms(len(ctx.pages))
        if recompute >= expected_wait_ms and swap >= expected_wait_ms:
            return "keep"
        return "drop" if recompute < swap else "offload"

    async def wait(self, ctx, until, expected_wait_ms: int, policy: str | None = None) -> str:
        """Wait for ``until()`` with the KV cache kept, offloaded or dropped; ready to forward after."""
        ctx.free_pages_ahead()  # while waiting, hold no page but those of the K/V
        decision = policy or await self.decide(ctx, expected_wait_ms)
        pages, freed_at = len(ctx.pages), inferlet.now_ms()
        self.report({"type": "kv", "decision": decision, "tokens": len(ctx.tokens), "pages": pages,
                     "expected_wait_ms": expected_wait_ms, "costs": self.costs.coefficients})
        if decision == "offload":
            await ctx.offload()
        elif decision == "drop":
            ctx.evict()  # the next forward recomputes every token
        await until()
        if decision == "offload":
            await ctx.restore()
        if decision != "keep":
            self.page_ms_saved += pages * (inferlet.now_ms() - freed_at)
        return decision

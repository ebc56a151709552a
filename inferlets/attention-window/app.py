"""attention-window: decoding with an attention sink and a sliding window (StreamingLLM's mask).

Arguments: PROMPT SINK WINDOW MAX_NEW_TOKENS [TOP_K=5]

At every decode step the token being forwarded, at position n-1, sees only the first SINK
tokens and the last WINDOW ones (positions n-WINDOW .. n-1, itself included); the tokens in
between are hidden with mask-kvpage (``Context.drop_range``) and stay hidden, keeping their positions.
The prompt but its last token is prefilled with ordinary causal attention; the window applies
from the distribution after the prompt on. Hidden tokens keep their pages (this shows the
masking, not memory savings). Greedy. Sends one JSON message per step: the top-k of the
next-token distribution, {"token_ids": [...], "probs": [...]}.
"""

import json

import inferlet

USAGE = "usage: attention-window PROMPT SINK WINDOW MAX_NEW_TOKENS [TOP_K]"


async def main(args: list[str]) -> None:
    numbers = args[1:]
    if len(args) not in (4, 5) or not all(a.isdigit() for a in numbers):
        raise ValueError(USAGE)
    sink, window, max_new = map(int, numbers[:3])
    top_k = int(numbers[3]) if len(numbers) == 4 else 5
    if window < 1 or max_new < 1 or top_k < 1:
        raise ValueError(f"WINDOW, MAX_NEW_TOKENS and TOP_K must be at least 1; {USAGE}")
    prompt = inferlet.encode(args[0])
    if not prompt:
        raise ValueError("the prompt is empty")
    with inferlet.Context() as ctx:
        ctx.fill_tokens(prompt)
        await ctx.flush()  # all but the last token, which the first step feeds
        hidden_end = sink  # tokens [sink, hidden_end) are hidden
        for _ in range(max_new):
            if len(ctx) - window > hidden_end:
                await ctx.drop_range(hidden_end, len(ctx) - window)
                hidden_end = len(ctx) - window
            dist = await ctx.next_dist(top_k)
            inferlet.send(json.dumps({"token_ids": dist.token_ids, "probs": dist.probs}))
            ctx.fill_tokens(dist.token_ids[:1])


WitWorld = inferlet.run(main)

"""attention-window: decoding with an attention sink and a sliding window (StreamingLLM's mask).

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
from inferlet.arguments import whole

ARGS = inferlet.ArgumentParser("attention-window", __doc__)
ARGS.add_argument("prompt", metavar="PROMPT", help="the text to continue")
ARGS.add_argument("sink", metavar="SINK", type=whole(0), help="first tokens always visible")
ARGS.add_argument("window", metavar="WINDOW", type=whole(1), help="last tokens visible, the forwarded one included")
ARGS.add_argument("max_new_tokens", metavar="MAX_NEW_TOKENS", type=whole(1), help="tokens to generate")
ARGS.add_argument("top_k", metavar="TOP_K", type=whole(1), nargs="?", default=5,
                  help="most probable tokens sent per step (default %(default)s)")


async def main(args: list[str]) -> None:
    opt = ARGS.parse(args)
    sink, window = opt.sink, opt.window
    prompt = inferlet.encode(opt.prompt)
    if not prompt:
        ARGS.error("the prompt is empty")
    with inferlet.Context() as ctx:
        ctx.fill_tokens(prompt)
        await ctx.flush()  # all but the last token, which the first step feeds
        hidden_end = sink  # tokens [sink, hidden_end) are hidden
        for _ in range(opt.max_new_tokens):
            if len(ctx) - window > hidden_end:
                await ctx.drop_range(hidden_end, len(ctx) - window)
                hidden_end = len(ctx) - window
            dist = await ctx.next_dist(opt.top_k)
            inferlet.send(json.dumps({"token_ids": dist.token_ids, "probs": dist.probs}))
            ctx.fill_tokens(dist.token_ids[:1])


WitWorld = inferlet.run(main)

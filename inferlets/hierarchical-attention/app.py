"""hierarchical-attention: sections that see only a shared header and themselves, then a query that sees all.

One context holds the header, the sections one after another and the query, each encoded on its own.
Attention is block-diagonal over the sections: a section's tokens attend to the header and to the
tokens of their own section before them, never to another section; the query (and every token decoded
after it) attends to everything. Positions are the tokens' places in the whole context. The blocks are
page masks (mask-kvpage, ``Context.drop_range``), as attention-window's window: each section is
forwarded in one step with the sections before it hidden, and they are all shown again before the query.
The hiding happens once the section's first token is pending (a context cannot hide its last token),
so that token is forwarded with its section and sees what the section sees.

--full forwards the same tokens in the same steps with no mask (ordinary causal attention): the
baseline the masked run differs from. Greedy; M steps, end tokens not stopping them.

Sends one JSON message: {"header": [ids], "sections": [[ids]], "query": [ids], "steps": [{"token_ids",
"probs"}: each step's top-K next-token distribution, most probable first], "tokens": [the M ids],
"text"}.
"""

import json

import inferlet
from inferlet.arguments import text, whole

ARGS = inferlet.ArgumentParser("hierarchical-attention", __doc__)
ARGS.add_argument("header", metavar="HEADER", type=text, help="the text every section sees")
ARGS.add_argument("sections", metavar="SECTION", nargs="+", type=text, help="a section (two or more)")
ARGS.add_argument("--query", metavar="QUERY", type=text, required=True, help="the text that sees them all")
ARGS.add_argument("--max-tokens", metavar="M", type=whole(1), default=8, help="greedy steps (default %(default)s)")
ARGS.add_argument("--top-k", metavar="K", type=whole(1), default=5,
                  help="the tokens of each step's distribution sent (default %(default)s)")
ARGS.add_argument("--full", action="store_true", help="no mask: ordinary causal attention (the baseline)")


async def main(args: list[str]) -> None:
    opt = ARGS.parse(args)
    if len(opt.sections) < 2:
        ARGS.error("give two or more SECTIONs")
    header, query = inferlet.encode(opt.header), inferlet.encode(opt.query)
    sections = [inferlet.encode(t) for t in opt.sections]
    masked = not opt.full
    with inferlet.Context() as ctx:
        ctx.fill_tokens(header + sections[0])
        await ctx.next_dist(1)  # forwards them all: the first section sees the header and itself
        starts = [len(header)]
        for section in sections[1:]:
            starts.append(len(ctx))
            ctx.fill_tokens(section[:1])
            if masked:  # the section before joins the hidden ones: every section but this one is hidden
                await ctx.drop_range(starts[-2], starts[-1])
            ctx.fill_tokens(section[1:])
            await ctx.next_dist(1)
        ctx.fill_tokens(query[:1])
        if masked:
            await ctx.undrop_range(len(header), starts[-1])  # the query sees every section
        ctx.fill_tokens(query[1:])
        steps, tokens = [], []
        for _ in range(opt.max_tokens):
            dist = await ctx.next_dist(opt.top_k)
            steps.append({"token_ids": dist.token_ids, "probs": dist.probs})
            tokens.append(dist.token_ids[0])
            ctx.fill_tokens(tokens[-1:])
    inferlet.send(json.dumps({"header": header, "sections": sections, "query": query, "steps": steps,
                              "tokens": tokens, "text": inferlet.decode(tokens)}))


WitWorld = inferlet.run(main)

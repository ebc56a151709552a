"""hierarchical-attention: sections that see only a shared header and themselves, then a query that sees all.

Arguments: HEADER SECTION SECTION [SECTION ...] --query QUERY [--max-tokens M=8] [--top-k K=5] [--full]

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

USAGE = ("usage: hierarchical-attention HEADER SECTION SECTION [SECTION ...] --query QUERY [--max-tokens M] "
         "[--top-k K] [--full]")


def parse(args: list[str]) -> tuple[list[str], dict]:
    opt = {"--query": None, "--max-tokens": 8, "--top-k": 5, "--full": False}
    positional, it = [], iter(args)
    try:
        for arg in it:
            if arg == "--full":
                opt[arg] = True
            elif arg == "--query":
                opt[arg] = next(it)
            elif arg in opt:
                opt[arg] = int(next(it))
            elif arg.startswith("--"):
                raise ValueError(f"unknown option {arg}")
            else:
                positional.append(arg)
    except (StopIteration, ValueError) as exc:
        raise ValueError(f"{str(exc) or 'an option needs a value'}; {USAGE}") from None
    if len(positional) < 3 or not all(p.strip() for p in positional) or not (opt["--query"] or "").strip():
        raise ValueError(f"give a HEADER, two or more SECTIONs and a --query, none empty; {USAGE}")
    if min(opt["--max-tokens"], opt["--top-k"]) < 1:
        raise ValueError(f"M and K must be >= 1; {USAGE}")
    return positional, opt


async def main(args: list[str]) -> None:
    texts, opt = parse(args)
    header, query = inferlet.encode(texts[0]), inferlet.encode(opt["--query"])
    sections = [inferlet.encode(t) for t in texts[1:]]
    masked = not opt["--full"]
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
        for _ in range(opt["--max-tokens"]):
            dist = await ctx.next_dist(opt["--top-k"])
            steps.append({"token_ids": dist.token_ids, "probs": dist.probs})
            tokens.append(dist.token_ids[0])
            ctx.fill_tokens(tokens[-1:])
    inferlet.send(json.dumps({"header": header, "sections": sections, "query": query, "steps": steps,
                              "tokens": tokens, "text": inferlet.decode(tokens)}))


WitWorld = inferlet.run(main)

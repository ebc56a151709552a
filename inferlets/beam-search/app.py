"""beam-search: the WIDTH best continuations of exactly LENGTH tokens, by beam search.

A beam's score is the sum of its tokens' log-probabilities. Each step, every beam proposes its K
most probable next tokens (K = WIDTH unless given) and the WIDTH best candidates survive; ties go
to the earlier beam, then to the more probable token (beams are kept best first). End tokens are
not special: every beam has LENGTH tokens. With K = WIDTH the search is exact over the tree of
top-K continuations once WIDTH >= K**(LENGTH-1).

Beams share KV pages: a parent's first surviving child takes its context over, the others fork it
(full pages shared, the partial last page copied), so no prefix is forwarded twice; each step's
forwards run concurrently and batch together. Sends one JSON message, best first:
[{"tokens": [ids], "score": log-probability, "text": ...}, ...].
"""

import json
import math

import inferlet
from inferlet.arguments import text, whole

ARGS = inferlet.ArgumentParser("beam-search", __doc__)
ARGS.add_argument("prompt", metavar="PROMPT", type=text, help="the text to continue")
ARGS.add_argument("width", metavar="WIDTH", type=whole(1), help="beams kept, and continuations sent")
ARGS.add_argument("length", metavar="LENGTH", type=whole(1), help="tokens in each continuation")
ARGS.add_argument("--expand", metavar="K", type=whole(1), help="next tokens each beam proposes (default WIDTH)")


async def main(args: list[str]) -> None:
    opt = ARGS.parse(args)
    width, length, expand = opt.width, opt.length, opt.expand or opt.width
    root = inferlet.Context()
    root.fill(opt.prompt)
    beams = [(0.0, [], root)]  # (score, tokens, context whose pending token is the last of tokens)
    for step in range(length):
        dists = await inferlet.gather(*(ctx.next_dist(expand) for _, _, ctx in beams))
        candidates = [(score + math.log(p), b, rank, token)
                      for b, ((score, _, _), dist) in enumerate(zip(beams, dists))
                      for rank, (token, p) in enumerate(zip(dist.token_ids, dist.probs)) if p > 0]
        chosen = sorted(candidates, key=lambda c: (-c[0], c[1], c[2]))[:width]
        parents, firsts = beams, {}
        if step == length - 1:
            beams = [(score, parents[b][1] + [token], None) for score, b, _, token in chosen]
            for _, _, ctx in parents:
                ctx.close()
            break
        for i, (_, b, _, _) in enumerate(chosen):
            firsts.setdefault(b, i)
        forks = iter(await inferlet.gather(*(parents[b][2].fork() for i, (_, b, _, _) in enumerate(chosen)
                                             if firsts[b] != i)))
        beams = [(score, parents[b][1] + [token], parents[b][2] if firsts[b] == i else next(forks))
                 for i, (score, b, _, token) in enumerate(chosen)]
        for b, (_, _, ctx) in enumerate(parents):
            if b not in firsts:
                ctx.close()
        for _, tokens, ctx in beams:  # only now: a fork copies its parent's pending tokens
            ctx.fill_tokens(tokens[-1:])
    inferlet.send(json.dumps([{"tokens": t, "score": s, "text": inferlet.decode(t)} for s, t, _ in beams]))


WitWorld = inferlet.run(main)

"""best-of-n: N sampled candidates ranked by the model's own likelihood, with a diversity penalty.

The prompt (raw text, or one user turn with --chat) is forwarded once; N forks of it each sample a
candidate of at most M tokens (top-p P at temperature T, candidate i seeded S + i, so a run is
reproducible whatever runs beside it), and all N decode side by side. Each candidate's quality is
the mean log-probability of its tokens under the model (the model's own, before temperature: a
final end token counts too). The ranking is greedy, as maximal marginal relevance: the first is the
candidate of highest quality; each next one is the remaining candidate of highest

    score = quality - L * overlap,  overlap = max over those ranked above of |g(c) & g(a)| / |g(c)|

where g(x) is the set of x's token G-grams (no G-gram: overlap 0). So a near copy of a better
candidate drops below a different one, and L = 0 ranks by quality alone. Ties go to the lower
index. Sends one JSON message: {"best": the first ranked, "ranking": [{"index", "tokens", "text",
"quality", "overlap", "score"}, best first]}.
"""

import json

import inferlet
from inferlet.arguments import number, text, whole

ARGS = inferlet.ArgumentParser("best-of-n", __doc__)
ARGS.add_argument("prompt", metavar="PROMPT", type=text, help="the text to continue")
ARGS.add_argument("--n", metavar="N", type=whole(1, 64), default=4, help="candidates sampled (default %(default)s)")
ARGS.add_argument("--max-tokens", metavar="M", type=whole(1), default=32,
                  help="tokens at most per candidate (default %(default)s)")
ARGS.add_argument("--temperature", metavar="T", type=number(0), default=0.8,
                  help="the sampling temperature (default %(default)s)")
ARGS.add_argument("--top-p", metavar="P", type=number(above=0, high=1), default=1.0,
                  help="the nucleus's probability mass (default %(default)s)")
ARGS.add_argument("--seed", metavar="S", type=whole(0), default=0,
                  help="candidate i's seed is S + i (default %(default)s)")
ARGS.add_argument("--ngram", metavar="G", type=whole(1), default=2,
                  help="the overlap's n-gram size (default %(default)s)")
ARGS.add_argument("--diversity", metavar="L", type=number(0), default=1.0,
                  help="the overlap's weight in the score (default %(default)s)")
ARGS.add_argument("--chat", action="store_true", help="PROMPT is a user turn of the chat template")


def ngrams(tokens: list[int], size: int) -> set[tuple[int, ...]]:
    return {tuple(tokens[i:i + size]) for i in range(len(tokens) - size + 1)}


async def rank(candidates: list[dict], size: int, weight: float) -> list[dict]:
    """Maximal marginal relevance: each next, the remaining candidate of highest score (lower index on a
    tie), its overlap being the largest share of its G-grams that one candidate ranked above it also has.
    Each candidate's G-grams are made once and its overlap kept up to date as the others are ranked: N²
    set intersections, not N³."""
    grams = [ngrams(c["tokens"], size) for c in candidates]
    shared = [0.0] * len(candidates)
    left, ranked = list(range(len(candidates))), []

    def score(i: int) -> float:
        return candidates[i]["quality"] - weight * shared[i]

    while left:
        best = max(left, key=lambda i: (score(i), -candidates[i]["index"]))
        left.remove(best)
        ranked.append({**candidates[best], "overlap": shared[best], "score": score(best)})
        for i in left:
            if grams[i]:
                shared[i] = max(shared[i], len(grams[i] & grams[best]) / len(grams[i]))
        await inferlet.sleep(0)  # many long candidates: the ranking must not run a slice past its deadline
    return ranked


async def candidate(prompt: inferlet.Context, index: int, opt) -> dict:
    sampler = inferlet.TopP(opt.top_p, temperature=opt.temperature, seed=opt.seed + index)
    with await prompt.fork() as ctx:
        text = await ctx.generate(sampler, inferlet.Stop(max_tokens=opt.max_tokens), inferlet.Shape(logprobs=0))
        logprobs = [lp.logprob for lp in ctx.logprobs]
        return {"index": index, "tokens": list(ctx.generated), "text": text,
                "quality": sum(logprobs) / len(logprobs)}


async def main(args: list[str]) -> None:
    opt = ARGS.parse(args)
    with inferlet.Context() as prompt:
        if opt.chat:
            prompt.fill_chat([{"role": "user", "content": opt.prompt}])
        else:
            prompt.fill(opt.prompt)
        await prompt.flush()  # all but the last token: each fork feeds that one itself
        candidates = await inferlet.gather(*(candidate(prompt, i, opt) for i in range(opt.n)))
    ranking = await rank(candidates, opt.ngram, opt.diversity)
    inferlet.send(json.dumps({"best": ranking[0], "ranking": ranking}))


WitWorld = inferlet.run(main)

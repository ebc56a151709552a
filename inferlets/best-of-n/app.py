"""best-of-n: N sampled candidates ranked by the model's own likelihood, with a diversity penalty.

Arguments: PROMPT [--n N=4] [--max-tokens M=32] [--temperature T=0.8] [--top-p P=1.0] [--seed S=0]
           [--ngram G=2] [--diversity L=1.0] [--chat]

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

USAGE = ("usage: best-of-n PROMPT [--n N] [--max-tokens M] [--temperature T] [--top-p P] [--seed S] "
         "[--ngram G] [--diversity L] [--chat]")
INT_OPTIONS, FLOAT_OPTIONS = ("--n", "--max-tokens", "--seed", "--ngram"), ("--temperature", "--top-p", "--diversity")


def parse(args: list[str]) -> tuple[str, dict]:
    opt = {"--n": 4, "--max-tokens": 32, "--seed": 0, "--ngram": 2, "--temperature": 0.8, "--top-p": 1.0,
           "--diversity": 1.0, "--chat": False}
    positional, it = [], iter(args)
    try:
        for arg in it:
            if arg == "--chat":
                opt[arg] = True
            elif arg in INT_OPTIONS:
                opt[arg] = int(next(it))
            elif arg in FLOAT_OPTIONS:
                opt[arg] = float(next(it))
            elif arg.startswith("--"):
                raise ValueError(f"unknown option {arg}")
            else:
                positional.append(arg)
    except (StopIteration, ValueError) as exc:
        raise ValueError(f"{str(exc) or 'an option needs a value'}; {USAGE}") from None
    if len(positional) != 1 or not positional[0]:
        raise ValueError(f"give one non-empty PROMPT; {USAGE}")
    if min(opt["--n"], opt["--max-tokens"], opt["--ngram"]) < 1 or opt["--seed"] < 0:
        raise ValueError(f"N, M and G must be >= 1 and S >= 0; {USAGE}")
    if not (opt["--temperature"] >= 0 and 0 < opt["--top-p"] <= 1 and opt["--diversity"] >= 0):
        raise ValueError(f"T and L must be >= 0 and P in (0, 1]; {USAGE}")
    return positional[0], opt


def ngrams(tokens: list[int], size: int) -> set[tuple[int, ...]]:
    return {tuple(tokens[i:i + size]) for i in range(len(tokens) - size + 1)}


def overlap(tokens: list[int], above: list[list[int]], size: int) -> float:
    """The largest share of ``tokens``' G-grams that one candidate ranked above also has."""
    own = ngrams(tokens, size)
    if not own:
        return 0.0
    return max((len(own & ngrams(a, size)) / len(own) for a in above), default=0.0)


def rank(candidates: list[dict], size: int, weight: float) -> list[dict]:
    """Maximal marginal relevance: each next, the remaining candidate of highest score (lower index on a tie)."""
    left, ranked = list(candidates), []
    while left:
        scored = [(c["quality"] - weight * o, c, o)
                  for c, o in ((c, overlap(c["tokens"], [r["tokens"] for r in ranked], size)) for c in left)]
        score, best, shared = max(scored, key=lambda s: (s[0], -s[1]["index"]))
        ranked.append({**best, "overlap": shared, "score": score})
        left.remove(best)
    return ranked


async def candidate(prompt: inferlet.Context, index: int, opt: dict) -> dict:
    sampler = inferlet.TopP(opt["--top-p"], temperature=opt["--temperature"], seed=opt["--seed"] + index)
    with await prompt.fork() as ctx:
        text = await ctx.generate(sampler, inferlet.Stop(max_tokens=opt["--max-tokens"]), inferlet.Shape(logprobs=0))
        logprobs = [lp.logprob for lp in ctx.logprobs]
        return {"index": index, "tokens": list(ctx.generated), "text": text,
                "quality": sum(logprobs) / len(logprobs)}


async def main(args: list[str]) -> None:
    prompt_text, opt = parse(args)
    with inferlet.Context() as prompt:
        if opt["--chat"]:
            prompt.fill_chat([{"role": "user", "content": prompt_text}])
        else:
            prompt.fill(prompt_text)
        await prompt.flush()  # all but the last token: each fork feeds that one itself
        candidates = await inferlet.gather(*(candidate(prompt, i, opt) for i in range(opt["--n"])))
    ranking = rank(candidates, opt["--ngram"], opt["--diversity"])
    inferlet.send(json.dumps({"best": ranking[0], "ranking": ranking}))


WitWorld = inferlet.run(main)

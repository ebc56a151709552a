"""self-correct: answer, verify, and on a rejection rewind the KV cache to a snapshot and try again.

The prompt (raw text, or one user turn with --chat) is forwarded once and its length taken as the
snapshot. Attempt a samples an answer of at most M tokens (temperature T, seed S + a) after it; a
verifier then accepts or rejects the answer: --pattern, when the whole answer (stripped) matches
REGEX; --judge, when the model itself, asked on a fork of the context holding the answer whether
it is correct, answers "yes" (a choice grammar holds it to yes or no; greedy). A rejected answer is
rewound: the context is truncated to the snapshot's length, which gives back the pages past it and
leaves the prompt's K/V as they were: the next attempt forwards only the prompt's last token again.
At most N attempts; the last rejected one is rewound too.

--probe K: after every rewind, take the distribution after the rewound context (its 8 most probable
tokens) and decode K greedy tokens (end tokens not stopping them) from it, then rewind again. They
are what a fresh prefill of the snapshot gives if the rewind restored exactly the snapshot's K/V
(tests/test_self_correct.py checks this).

Sends one JSON message: {"snapshot": [ids], "answer": the accepted text or null, "attempts":
[{"seed", "tokens", "text", "accepted"}], "rewinds": [{"pages": pages held after it, "probe": [ids],
"dist": {"ids", "probs"}}]}.
"""

import json

import inferlet
from inferlet.arguments import number, regex, text, whole

PROBE_TOP_K = 8
JUDGE_PROMPT = "\nQuestion: is the answer above correct? Reply yes or no.\nReply:"


ARGS = inferlet.ArgumentParser("self-correct", __doc__)
ARGS.add_argument("prompt", metavar="PROMPT", type=text, help="the question")
VERIFIER = ARGS.add_mutually_exclusive_group(required=True)
VERIFIER.add_argument("--pattern", metavar="REGEX", type=regex(), help="accept an answer that REGEX matches whole")
VERIFIER.add_argument("--judge", action="store_true", help="accept an answer the model itself says is correct")
ARGS.add_argument("--attempts", metavar="N", type=whole(1), default=4, help="attempts at most (default %(default)s)")
ARGS.add_argument("--max-tokens", metavar="M", type=whole(1), default=32,
                  help="tokens per answer at most (default %(default)s)")
ARGS.add_argument("--temperature", metavar="T", type=number(0), default=0.8,
                  help="the answers' temperature (default %(default)s)")
ARGS.add_argument("--seed", metavar="S", type=whole(0), default=0,
                  help="the first attempt's seed; attempt a samples with S + a (default %(default)s)")
ARGS.add_argument("--chat", action="store_true", help="PROMPT is a user turn of the chat template")
ARGS.add_argument("--probe", metavar="K", type=whole(0), default=0,
                  help="after each rewind, decode K greedy tokens from it (default %(default)s)")


async def judged_correct(ctx: inferlet.Context) -> bool:
    """The model's own verdict on the answer ``ctx`` ends with, asked on a fork (``ctx`` is left as it is)."""
    grammar = inferlet.Grammar.choice([" yes", " no"])
    try:
        with await ctx.fork() as judge:
            judge.fill(JUDGE_PROMPT)
            verdict = await judge.generate(inferlet.Greedy(), inferlet.Stop(max_tokens=4),
                                           inferlet.Shape(grammar=grammar))
    finally:
        grammar.drop()
    return verdict == " yes"


async def rewind(ctx: inferlet.Context, snapshot: int, probe: int) -> dict:
    """Truncate ``ctx`` to the snapshot; with ``probe``, read what follows it, then truncate again."""
    ctx.truncate(snapshot)
    rewound = {"pages": len(ctx.pages.handles), "probe": [], "dist": None}
    if probe:
        dist = await ctx.next_dist(PROBE_TOP_K)
        rewound["dist"] = {"ids": list(dist.token_ids), "probs": list(dist.probs)}
        greedy = await ctx.generate_tokens(inferlet.Greedy(), inferlet.Stop(max_tokens=probe, eos=False))
        rewound["probe"] = list(greedy)
        ctx.truncate(snapshot)
    return rewound


async def main(args: list[str]) -> None:
    opt = ARGS.parse(args)
    attempts, rewinds, answer = [], [], None
    with inferlet.Context() as ctx:
        if opt.chat:
            ctx.fill_chat([{"role": "user", "content": opt.prompt}])
        else:
            ctx.fill(opt.prompt)
        await ctx.flush()  # the prompt's K/V but the last token's, which the first step feeds
        snapshot_tokens = ctx.tokens + ctx.pending
        for a in range(opt.attempts):
            seed = opt.seed + a
            text = await ctx.generate(inferlet.Temperature(opt.temperature, seed=seed),
                                      inferlet.Stop(max_tokens=opt.max_tokens))
            if opt.judge:
                accepted = await judged_correct(ctx)
            else:
                accepted = opt.pattern.fullmatch(text.strip()) is not None
            attempts.append({"seed": seed, "tokens": list(ctx.generated), "text": text, "accepted": accepted})
            if accepted:
                answer = text
                break
            rewinds.append(await rewind(ctx, len(snapshot_tokens), opt.probe))
    inferlet.send(json.dumps({"snapshot": snapshot_tokens, "answer": answer, "attempts": attempts,
                              "rewinds": rewinds}))


WitWorld = inferlet.run(main)

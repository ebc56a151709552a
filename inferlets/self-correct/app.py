"""self-correct: answer, verify, and on a rejection rewind the KV cache to a snapshot and try again.

Arguments: PROMPT (--pattern REGEX | --judge) [--attempts N=4] [--max-tokens M=32]
           [--temperature T=0.8] [--seed S=0] [--chat] [--probe K=0]

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
import re

import inferlet

USAGE = ("usage: self-correct PROMPT (--pattern REGEX | --judge) [--attempts N] [--max-tokens M] "
         "[--temperature T] [--seed S] [--chat] [--probe K]")
PROBE_TOP_K = 8
JUDGE_PROMPT = "\nQuestion: is the answer above correct? Reply yes or no.\nReply:"


def parse(args: list[str]) -> tuple[str, dict]:
    opt = {"--pattern": None, "--judge": False, "--chat": False, "--attempts": 4, "--max-tokens": 32,
           "--seed": 0, "--probe": 0, "--temperature": 0.8}
    positional, it = [], iter(args)
    try:
        for arg in it:
            if arg in ("--judge", "--chat"):
                opt[arg] = True
            elif arg == "--pattern":
                opt[arg] = re.compile(next(it))
            elif arg == "--temperature":
                opt[arg] = float(next(it))
            elif arg in opt:
                opt[arg] = int(next(it))
            elif arg.startswith("--"):
                raise ValueError(f"unknown option {arg}")
            else:
                positional.append(arg)
    except (StopIteration, ValueError, re.error) as exc:
        raise ValueError(f"{str(exc) or 'an option needs a value'}; {USAGE}") from None
    if len(positional) != 1 or not positional[0]:
        raise ValueError(f"give one non-empty PROMPT; {USAGE}")
    if (opt["--pattern"] is None) == (not opt["--judge"]):
        raise ValueError(f"give one verifier, --pattern or --judge; {USAGE}")
    if min(opt["--attempts"], opt["--max-tokens"]) < 1 or min(opt["--seed"], opt["--probe"]) < 0 \
            or not opt["--temperature"] >= 0:
        raise ValueError(f"N and M must be >= 1, S, K and T >= 0; {USAGE}")
    return positional[0], opt


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
    prompt, opt = parse(args)
    attempts, rewinds, answer = [], [], None
    with inferlet.Context() as ctx:
        if opt["--chat"]:
            ctx.fill_chat([{"role": "user", "content": prompt}])
        else:
            ctx.fill(prompt)
        await ctx.flush()  # the prompt's K/V but the last token's, which the first step feeds
        snapshot_tokens = ctx.tokens + ctx.pending
        for a in range(opt["--attempts"]):
            seed = opt["--seed"] + a
            text = await ctx.generate(inferlet.Temperature(opt["--temperature"], seed=seed),
                                      inferlet.Stop(max_tokens=opt["--max-tokens"]))
            if opt["--judge"]:
                accepted = await judged_correct(ctx)
            else:
                accepted = opt["--pattern"].fullmatch(text.strip()) is not None
            attempts.append({"seed": seed, "tokens": list(ctx.generated), "text": text, "accepted": accepted})
            if accepted:
                answer = text
                break
            rewinds.append(await rewind(ctx, len(snapshot_tokens), opt["--probe"]))
    inferlet.send(json.dumps({"snapshot": snapshot_tokens, "answer": answer, "attempts": attempts,
                              "rewinds": rewinds}))


WitWorld = inferlet.run(main)

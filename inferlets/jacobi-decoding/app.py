"""jacobi-decoding: greedy decoding by Jacobi fixed-point iteration (Santilli et al. 2023), several
positions verified per forward.

Arguments: PROMPT [MAX_NEW_TOKENS=32] [--window N=4]

Greedy decoding is the fixed point of y_i = argmax p(y | prompt, y_<i) over a whole block of
future positions, and Jacobi iteration reaches it from any guess. Each round forwards the last
accepted token (the *anchor*) together with N guesses for the positions after it, in one forward
(``Context.dists``), and reads the greedy token predicted at every position. The prediction after
the anchor is greedy's next token; so is the prediction after each guess that equals the
prediction before it. That prefix has converged: it is accepted (at least one token a round), and
the first prediction past it becomes the next anchor. The other predictions are the guesses'
Jacobi update: shifted past the accepted tokens, they are the next round's guesses, padded with
the last accepted token (the first round guesses it N times). The output is exactly greedy
decoding's; what converged guesses save is forwards.

KV: the anchor's and the accepted guesses' K/V stay (they were computed over exactly the tokens
greedy decoding would have had there); the rejected guesses' slots are truncated away and
rewritten by the next round. A round never guesses past MAX_NEW_TOKENS; an end token ends the run.
``--window 0`` is plain greedy decoding (``Context.generate``, one forward a token): the baseline.

Sends one JSON message: {"tokens": [...], "forward_calls": F, "accepted_per_round": [...]}, F
counting the prefill (which gives the first token), one entry per Jacobi round.
"""

import json

import inferlet

USAGE = "usage: jacobi-decoding PROMPT [MAX_NEW_TOKENS] [--window N>=0]"


def parse(args: list[str]) -> tuple[str, int, int]:
    window = 4
    if "--window" in args:
        at = args.index("--window")
        if at + 1 >= len(args) or not args[at + 1].isdigit():
            raise ValueError(f"--window needs a whole number; {USAGE}")
        window, args = int(args[at + 1]), args[:at] + args[at + 2:]
    if not args or len(args) > 2 or args[0].startswith("--"):
        raise ValueError(USAGE)
    if len(args) == 2 and not (args[1].isdigit() and int(args[1]) > 0):
        raise ValueError(f"MAX_NEW_TOKENS must be a positive whole number, not {args[1]!r}; {USAGE}")
    if not args[0]:
        raise ValueError("the prompt is empty")
    return args[0], int(args[1]) if len(args) == 2 else 32, window


def converged(guesses: list[int], predicted: list[int]) -> int:
    """How many leading guesses equal the prediction before them (the fixed prefix)."""
    agree = 0
    while agree < len(guesses) and guesses[agree] == predicted[agree]:
        agree += 1
    return agree


async def jacobi(ctx: inferlet.Context, max_new: int, window: int) -> tuple[list[int], int, list[int]]:
    """Decode from ``ctx`` (the prompt filled); the tokens, the forwards and the tokens accepted per round."""
    end = inferlet.stop_tokens()
    generated = [await ctx.decode_step()]  # the prefill; the anchor stays pending
    forwards, accepted, guesses = 1, [], []
    while len(generated) < max_new and generated[-1] not in end:
        size = min(window, max_new - len(generated) - 1)
        guesses = (guesses + [generated[-1]] * size)[:size]
        base = len(ctx)  # through the anchor
        ctx.fill_tokens(guesses)
        predicted = [dist.token_ids[0] for dist in await ctx.dists(top_k=1)]
        forwards += 1
        agree = converged(guesses, predicted)
        new = predicted[:agree + 1]
        stop = next((i + 1 for i, token in enumerate(new) if token in end), len(new))
        new = new[:stop]
        kept = min(agree, len(new))  # guesses whose K/V stay: less than agree when an end token came first
        ctx.truncate(base + kept)
        if len(new) > kept:
            ctx.fill_tokens(new[-1:])  # the next anchor
        generated += new
        accepted.append(len(new))
        guesses = predicted[agree + 1:]
    return generated, forwards, accepted


async def main(args: list[str]) -> None:
    prompt, max_new, window = parse(args)
    with inferlet.Context() as ctx:
        ctx.fill(prompt)
        if window == 0:
            tokens = await ctx.generate_tokens(inferlet.Greedy(), inferlet.Stop(max_tokens=max_new))
            forwards, accepted = len(tokens), []
        else:
            tokens, forwards, accepted = await jacobi(ctx, max_new, window)
    inferlet.send(json.dumps({"tokens": tokens, "forward_calls": forwards, "accepted_per_round": accepted}))


WitWorld = inferlet.run(main)

"""jacobi-decoding: greedy decoding by Jacobi fixed-point iteration (Santilli et al. 2023), several
positions verified per forward.

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
from inferlet.arguments import text, whole

ARGS = inferlet.ArgumentParser("jacobi-decoding", __doc__)
ARGS.add_argument("prompt", metavar="PROMPT", type=text, help="the prompt")
ARGS.add_argument("max_new", metavar="MAX_NEW_TOKENS", type=whole(1), nargs="?", default=32,
                  help="tokens at most (default %(default)s)")
ARGS.add_argument("--window", metavar="N", type=whole(0), default=4,
                  help="guesses per round; 0 is plain greedy decoding (default %(default)s)")


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
    opt = ARGS.parse(args)
    prompt, max_new, window = opt.prompt, opt.max_new, opt.window
    with inferlet.Context() as ctx:
        ctx.fill(prompt)
        if window == 0:
            tokens = await ctx.generate_tokens(inferlet.Greedy(), inferlet.Stop(max_tokens=max_new))
            forwards, accepted = len(tokens), []
        else:
            tokens, forwards, accepted = await jacobi(ctx, max_new, window)
    inferlet.send(json.dumps({"tokens": tokens, "forward_calls": forwards, "accepted_per_round": accepted}))


WitWorld = inferlet.run(main)

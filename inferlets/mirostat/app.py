"""mirostat: Mirostat v2 sampling, which steers each token's surprise towards a target.

Mirostat v2 (Basu et al. 2021), as llama.cpp runs it. mu starts at 2T. Each step keeps the most
probable tokens whose surprise -log2 p is at most mu (at least the most probable one), draws one of
them in proportion to p (the SDK's seeded draw: one ``Rng(S)`` draw per token, so a seed fixes the
tokens), and moves mu by the error between that token's surprise under the kept, renormalised
distribution and the target: mu <- mu - E * (surprise - T).

No approximation: the server gives the top K of the full softmax, and at most 2**mu tokens can have
p >= 2**-mu (their probabilities sum to at most 1), so asking for K = min(vocabulary, floor(2**mu) + 1)
gets every token that can survive and one that cannot (were that one to survive too, float rounding
being what it is, the step asks again for the whole vocabulary). A low mu asks for a handful of
probabilities, not the vocabulary's. Stops after M tokens or at an end token (kept in "tokens").

Sends one JSON message: {"tokens": [ids], "text": the text without end tokens, "kept": [how many
tokens survived, per step], "surprise": [the drawn token's renormalised surprise, per step], "mu":
[mu after each step]}.
"""

import json
import math

import inferlet
from inferlet.arguments import number, text, whole

ARGS = inferlet.ArgumentParser("mirostat", __doc__)
ARGS.add_argument("prompt", metavar="PROMPT", type=text, help="the text to continue")
ARGS.add_argument("--max-tokens", metavar="M", type=whole(1), default=32, help="tokens at most (default %(default)s)")
ARGS.add_argument("--tau", metavar="T", type=number(above=0, high=64), default=5.0,
                  help="the target surprise, in bits (default %(default)s)")
ARGS.add_argument("--eta", metavar="E", type=number(above=0, high=1), default=0.1,
                  help="how fast mu follows the error (default %(default)s)")
ARGS.add_argument("--seed", metavar="S", type=whole(0), default=0, help="the draws' seed (default %(default)s)")
ARGS.add_argument("--chat", action="store_true", help="PROMPT is a user turn of the chat template")


def candidates(mu: float, vocab: int) -> int:
    """How many of the most probable tokens to ask for: all that can have surprise <= mu, and one more."""
    if mu >= math.log2(vocab):
        return vocab
    return min(vocab, max(1, math.floor(2.0 ** mu) + 1))


def kept(probs: list[float], mu: float) -> int:
    """How many of the (sorted) tokens have surprise at most mu; at least one."""
    n = 0
    while n < len(probs) and probs[n] > 0 and -math.log2(probs[n]) <= mu:
        n += 1
    return max(n, 1)


def left_to_right_sum(values: list[float]) -> float:
    """Each addition rounded, in order: CPython's sum() compensates since 3.12, so its last bit would
    depend on the interpreter a reference runs on."""
    total = 0.0
    for v in values:
        total += v
    return total


async def mirostat(ctx: inferlet.Context, opt) -> dict:
    tau, eta, mu, rng = opt.tau, opt.eta, 2 * opt.tau, inferlet.Rng(opt.seed)
    vocab, stops = inferlet.vocab_size(), inferlet.stop_tokens()
    out = {"tokens": [], "kept": [], "surprise": [], "mu": []}
    while len(out["tokens"]) < opt.max_tokens and not (out["tokens"] and out["tokens"][-1] in stops):
        k = candidates(mu, vocab)
        dist = await ctx.next_dist(k)
        n = kept(dist.probs, mu)
        if n == k < vocab:  # the bound above, broken by rounding: look at every token
            dist = await ctx.next_dist(vocab)
            n = kept(dist.probs, mu)
        index = inferlet.draw(dist.probs, n, 1.0, rng)
        surprise = -math.log2(dist.probs[index] / left_to_right_sum(dist.probs[:n]))
        mu -= eta * (surprise - tau)
        ctx.fill_tokens([dist.token_ids[index]])
        for key, value in (("tokens", dist.token_ids[index]), ("kept", n), ("surprise", surprise), ("mu", mu)):
            out[key].append(value)
    out["text"] = inferlet.decode([t for t in out["tokens"] if t not in stops])
    return out


async def main(args: list[str]) -> None:
    opt = ARGS.parse(args)
    prompt = opt.prompt
    with inferlet.Context() as ctx:
        if opt.chat:
            ctx.fill_chat([{"role": "user", "content": prompt}])
        else:
            ctx.fill(prompt)
        await ctx.flush()
        inferlet.send(json.dumps(await mirostat(ctx, opt)))


WitWorld = inferlet.run(main)

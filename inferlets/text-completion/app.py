"""text-completion: a completion on the Python SDK.

Prints the completion and sends the generated token ids to the client as one message ("1 2 3").
Greedy unless a temperature is given. --pause MS decodes half the tokens, then waits for a client
message as an agent waits on a tool (announced with a pause hint of MS milliseconds: the server may
keep, swap or discard the context's K/V meanwhile), then decodes the rest. --steps decodes with
the SDK's primitives instead of ``generate`` (the tests pin their semantics with it): a flush, which forwards every prompt token
but the last, then per token ``next_dist`` twice, the second time with nothing pending, so the
last token is forwarded again; the token is sampled from the second distribution. --stepwise
samples in the inferlet (the sampler wrapped as a custom one), so ``generate`` waits for each
distribution instead of letting the server draw the tokens with one step in flight ahead (the
benchmarks' reference).
"""

import inferlet
from inferlet.arguments import number, whole

ARGS = inferlet.ArgumentParser("text-completion", __doc__)
ARGS.add_argument("prompt", metavar="PROMPT", help="the text to complete")
ARGS.add_argument("max_new_tokens", metavar="MAX_NEW_TOKENS", nargs="?", type=whole(0), default=32,
                  help="tokens at most (default %(default)s)")
ARGS.add_argument("--chat", action="store_true", help="PROMPT is a user turn of the chat template")
ARGS.add_argument("--temperature", metavar="T", type=number(0), help="sample at temperature T (default: greedy)")
ARGS.add_argument("--seed", metavar="S", type=int, default=0, help="the sampler's seed (default %(default)s)")
ARGS.add_argument("--stepwise", action="store_true", help="sample in the inferlet, waiting for each distribution")
DECODE = ARGS.add_mutually_exclusive_group()
DECODE.add_argument("--steps", action="store_true", help="decode with flush and next_dist instead of generate")
DECODE.add_argument("--pause", metavar="MS", type=int,
                    help="decode half the tokens, then wait for a client message, hinting a pause of MS ms")


class InInferlet(inferlet.Sampler):
    """A built-in sampler, run by the inferlet: ``generate`` then takes its step-by-step path."""

    def __init__(self, inner: inferlet.Sampler):
        self.inner, self.top_k = inner, inner.top_k

    def sample(self, token_ids, probs):
        return self.inner.sample(token_ids, probs)


async def by_steps(ctx: inferlet.Context, sampler: inferlet.Sampler, max_new: int) -> list[int]:
    """Decode like ``generate`` with a stop at ``max_new`` tokens or an end token; the tokens."""
    await ctx.flush()
    generated, end = [], inferlet.stop_tokens()
    while len(generated) < max_new and not (generated and generated[-1] in end):
        await ctx.next_dist(sampler.top_k)
        dist = await ctx.next_dist(sampler.top_k)  # nothing pending: the last token again
        generated.append(sampler.sample(dist.token_ids, dist.probs))
        ctx.fill_tokens(generated[-1:])
    return generated


async def with_pause(ctx: inferlet.Context, sampler: inferlet.Sampler, max_new: int, pause_ms: int) -> list[int]:
    """Decode half of ``max_new`` tokens, wait for a client message, decode the rest; the tokens."""
    generated = await ctx.generate_tokens(sampler, inferlet.Stop(max_tokens=max_new // 2))
    if generated and generated[-1] in inferlet.stop_tokens():
        return generated
    ctx.pause_hint(pause_ms)
    await inferlet.receive()
    return generated + await ctx.generate_tokens(sampler, inferlet.Stop(max_tokens=max_new - len(generated)))


async def main(args: list[str]) -> None:
    opt = ARGS.parse(args)
    sampler = inferlet.Greedy() if opt.temperature is None else inferlet.Temperature(opt.temperature, opt.seed)
    if opt.stepwise:
        sampler = InInferlet(sampler)

    with inferlet.Context() as ctx:
        if opt.chat:
            ctx.fill_chat([{"role": "user", "content": opt.prompt}])
        else:
            ctx.fill(opt.prompt)
        if opt.steps or opt.pause is not None:
            if opt.steps:
                generated = await by_steps(ctx, sampler, opt.max_new_tokens)
            else:
                generated = await with_pause(ctx, sampler, opt.max_new_tokens, opt.pause)
            end = inferlet.stop_tokens()
            print(inferlet.decode([t for t in generated if t not in end]))
        else:
            print(await ctx.generate(sampler, inferlet.Stop(max_tokens=opt.max_new_tokens)))
            generated = ctx.generated
        inferlet.send(" ".join(map(str, generated)))


WitWorld = inferlet.run(main)

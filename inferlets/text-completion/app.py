"""text-completion: a completion on the Python SDK.

Arguments: PROMPT [MAX_NEW_TOKENS=32] [--chat] [--temperature T] [--seed S] [--steps] [--stepwise]
[--pause MS].
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


def option(args: list[str], name: str, default: str | None = None) -> str | None:
    return args[args.index(name) + 1] if name in args else default


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
    if not args:
        raise SystemExit("usage: text-completion PROMPT [MAX_NEW_TOKENS] [--chat] [--temperature T] [--seed S] "
                         "[--steps] [--stepwise] [--pause MS]")
    max_new = int(args[1]) if len(args) > 1 and args[1].isdigit() else 32
    temperature = option(args, "--temperature")
    seed = option(args, "--seed")
    sampler = inferlet.Temperature(float(temperature), int(seed or 0)) if temperature else inferlet.Greedy()
    if "--stepwise" in args:
        sampler = InInferlet(sampler)

    with inferlet.Context() as ctx:
        if "--chat" in args:
            ctx.fill_chat([{"role": "user", "content": args[0]}])
        else:
            ctx.fill(args[0])
        if "--steps" in args or "--pause" in args:
            if "--steps" in args:
                generated = await by_steps(ctx, sampler, max_new)
            else:
                generated = await with_pause(ctx, sampler, max_new, int(option(args, "--pause")))
            end = inferlet.stop_tokens()
            print(inferlet.decode([t for t in generated if t not in end]))
        else:
            print(await ctx.generate(sampler, inferlet.Stop(max_tokens=max_new)))
            generated = ctx.generated
        inferlet.send(" ".join(map(str, generated)))


WitWorld = inferlet.run(main)

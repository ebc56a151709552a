"""tool-agent: an augmented-LLM request as InferCept studies it: generate, call a tool, append its result, repeat.

Greedy throughout. For each pause in --pauses: decode up to T tokens, announce the tool call with a
pause hint of MS milliseconds (the server's interception policy may keep, swap or discard the
context's K/V meanwhile), sleep MS milliseconds (the tool runs; the server sees the instance waiting
on a timer), then fill the tool's result ("Observation from NAME #i.") as the next turn. After the last
pause it decodes T more tokens. Sends every generated token id to the client as one message
("1 2 3"), so runs under different server policies can be compared token for token.
"""

import argparse

import inferlet
from inferlet.arguments import whole


def milliseconds(value: str) -> list[int]:
    try:
        return [whole(0)(ms) for ms in value.split(",") if ms]
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(f"expected whole numbers >= 0 separated by commas, not {value!r}") from None


ARGS = inferlet.ArgumentParser("tool-agent", __doc__)
ARGS.add_argument("prompt", metavar="PROMPT", help="the user's request")
ARGS.add_argument("--tokens", metavar="T", type=whole(0), default=8,
                  help="tokens decoded before each tool call and after the last (default %(default)s)")
ARGS.add_argument("--pauses", metavar="MS,MS,...", type=milliseconds, default=[],
                  help="one tool call per value, lasting MS milliseconds (default: none)")
ARGS.add_argument("--tool", metavar="NAME", default="tool", help="the tool's name in its results (default %(default)s)")


async def main(args: list[str]) -> None:
    opt = ARGS.parse(args)
    # A step ends at T tokens only: an end-of-turn token mid-step would end the agent's turn early, and
    # the tool's result starts the next turn anyway.
    stop = inferlet.Stop(max_tokens=opt.tokens, eos=False)
    generated: list[int] = []
    with inferlet.Context() as ctx:
        ctx.fill_chat([{"role": "user", "content": opt.prompt}])
        for i, ms in enumerate(opt.pauses):
            generated += await ctx.generate_tokens(inferlet.Greedy(), stop)
            ctx.pause_hint(ms)
            await inferlet.sleep(ms)
            ctx.fill(f"\nObservation from {opt.tool} #{i + 1}.\n")
        generated += await ctx.generate_tokens(inferlet.Greedy(), stop)
    inferlet.send(" ".join(map(str, generated)))


WitWorld = inferlet.run(main)

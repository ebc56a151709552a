"""tool-agent: an augmented-LLM request as InferCept studies it: generate, call a tool, append its result, repeat.

Arguments: PROMPT [--tokens T=8] [--pauses MS,MS,...] [--tool NAME]
Greedy throughout. For each pause in --pauses: decode up to T tokens, announce the tool call with a
pause hint of MS milliseconds (the server's interception policy may keep, swap or discard the
context's K/V meanwhile), sleep MS milliseconds (the tool runs; the server sees the instance waiting
on a timer), then fill the tool's result ("Observation from NAME #i.") as the next turn. After the last
pause it decodes T more tokens. Sends every generated token id to the client as one message
("1 2 3"), so runs under different server policies can be compared token for token.
"""

import inferlet

USAGE = "usage: tool-agent PROMPT [--tokens T] [--pauses MS,MS,...] [--tool NAME]"


def option(args: list[str], name: str, default: str) -> str:
    if name not in args:
        return default
    index = args.index(name) + 1
    if index >= len(args):
        raise SystemExit(f"{name} needs a value; {USAGE}")
    return args[index]


async def main(args: list[str]) -> None:
    if not args or args[0].startswith("--"):
        raise SystemExit(USAGE)
    tokens = int(option(args, "--tokens", "8"))
    pauses = [int(ms) for ms in option(args, "--pauses", "").split(",") if ms]
    tool = option(args, "--tool", "tool")
    # A step ends at T tokens only: an end-of-turn token mid-step would end the agent's turn early, and
    # the tool's result starts the next turn anyway.
    stop = inferlet.Stop(max_tokens=tokens, eos=False)
    generated: list[int] = []
    with inferlet.Context() as ctx:
        ctx.fill_chat([{"role": "user", "content": args[0]}])
        for i, ms in enumerate(pauses):
            generated += await ctx.generate_tokens(inferlet.Greedy(), stop)
            ctx.pause_hint(ms)
            await inferlet.sleep(ms)
            ctx.fill(f"\nObservation from {tool} #{i + 1}.\n")
        generated += await ctx.generate_tokens(inferlet.Greedy(), stop)
    inferlet.send(" ".join(map(str, generated)))


WitWorld = inferlet.run(main)

"""text-completion: a completion on the Python SDK.

Arguments: PROMPT [MAX_NEW_TOKENS=32] [--chat] [--temperature T] [--seed S].
Prints the completion and sends the generated token ids to the client as one message ("1 2 3").
Greedy unless a temperature is given.
"""

import inferlet


def option(args: list[str], name: str, default: str | None = None) -> str | None:
    return args[args.index(name) + 1] if name in args else default


async def main(args: list[str]) -> None:
    if not args:
        raise ValueError("usage: text-completion PROMPT [MAX_NEW_TOKENS] [--chat] [--temperature T] [--seed S]")
    max_new = int(args[1]) if len(args) > 1 and args[1].isdigit() else 32
    temperature = option(args, "--temperature")
    seed = option(args, "--seed")
    sampler = (inferlet.Temperature(float(temperature), int(seed) if seed else None) if temperature
               else inferlet.Greedy())

    with inferlet.Context() as ctx:
        if "--chat" in args:
            ctx.fill_chat([{"role": "user", "content": args[0]}])
        else:
            ctx.fill(args[0])
        print(await ctx.generate(sampler, inferlet.Stop(max_tokens=max_new)))
        inferlet.send(" ".join(map(str, ctx.generated)))


WitWorld = inferlet.run(main)

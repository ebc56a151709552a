"""constrained: a generation held to a grammar, on the Python SDK.

Arguments: KIND SPEC PROMPT [MAX_NEW_TOKENS=128] [--chat] [--temperature T] [--seed S] [--logprobs N].
KIND is json-schema (SPEC a JSON Schema), regex, lark or choice (SPEC a JSON array of strings). The
server masks every step with the grammar (pipelined: one step in flight ahead), so the text printed and
sent is in the grammar's language unless MAX_NEW_TOKENS ran out first (then the last message says
"stopped: max_tokens"). With --logprobs N a second message holds each token's log-probability and its
top N, as JSON.
"""

import json

import inferlet


def option(args: list[str], name: str, default: str | None = None) -> str | None:
    return args[args.index(name) + 1] if name in args else default


async def main(args: list[str]) -> None:
    if len(args) < 3:
        raise SystemExit("usage: constrained KIND SPEC PROMPT [MAX_NEW_TOKENS] [--chat] [--temperature T] [--seed S] "
                         "[--logprobs N]")
    kind, spec, prompt = args[:3]
    max_new = int(args[3]) if len(args) > 3 and args[3].isdigit() else 128
    temperature = option(args, "--temperature")
    sampler = inferlet.Temperature(float(temperature), int(option(args, "--seed", "0"))) if temperature \
        else inferlet.Greedy()
    grammar = inferlet.Grammar(kind, spec)
    shape = inferlet.Shape(grammar=grammar, logprobs=int(option(args, "--logprobs", "-1")))
    with inferlet.Context() as ctx:
        if "--chat" in args:
            ctx.fill_chat([{"role": "user", "content": prompt}])
        else:
            ctx.fill(prompt)
        text = await ctx.generate(sampler, inferlet.Stop(max_tokens=max_new), shape)
        print(text)
        inferlet.send(text)
        if shape.logprobs >= 0:
            inferlet.send(json.dumps([[lp.token, lp.logprob, lp.top] for lp in ctx.logprobs]))
        if not (ctx.generated and ctx.generated[-1] in inferlet.stop_tokens()):
            inferlet.send("stopped: max_tokens")


WitWorld = inferlet.run(main)

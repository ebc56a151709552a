"""constrained: a generation held to a grammar, on the Python SDK.

The server masks every step with the grammar (pipelined: one step in flight ahead), so the text printed
and sent is in the grammar's language unless MAX_NEW_TOKENS ran out first (then the last message says
"stopped: max_tokens"). With --logprobs N a second message holds each token's log-probability and its
top N, as JSON.
"""

import json

import inferlet
from inferlet.arguments import number, whole

ARGS = inferlet.ArgumentParser("constrained", __doc__)
ARGS.add_argument("kind", metavar="KIND", choices=("json-schema", "regex", "lark", "choice"),
                  help="the grammar's kind: json-schema, regex, lark or choice")
ARGS.add_argument("spec", metavar="SPEC", help="the grammar: a JSON Schema, a regex, a Lark grammar, or a JSON array "
                  "of strings (choice)")
ARGS.add_argument("prompt", metavar="PROMPT", help="the text to continue")
ARGS.add_argument("max_new_tokens", metavar="MAX_NEW_TOKENS", type=whole(0), nargs="?", default=128,
                  help="tokens at most (default %(default)s)")
ARGS.add_argument("--chat", action="store_true", help="PROMPT is a user turn of the chat template")
ARGS.add_argument("--temperature", metavar="T", type=number(0), help="sample at temperature T (default: greedy)")
ARGS.add_argument("--seed", metavar="S", type=whole(0), default=0,
                  help="the sampling seed, with --temperature (default %(default)s)")
ARGS.add_argument("--logprobs", metavar="N", type=whole(-1), default=-1,
                  help="send each token's log-probability and its top N too; -1: none (default %(default)s)")


async def main(args: list[str]) -> None:
    opt = ARGS.parse(args)
    sampler = inferlet.Temperature(opt.temperature, opt.seed) if opt.temperature is not None else inferlet.Greedy()
    grammar = inferlet.Grammar(opt.kind, opt.spec)
    shape = inferlet.Shape(grammar=grammar, logprobs=opt.logprobs)
    with inferlet.Context() as ctx:
        if opt.chat:
            ctx.fill_chat([{"role": "user", "content": opt.prompt}])
        else:
            ctx.fill(opt.prompt)
        text = await ctx.generate(sampler, inferlet.Stop(max_tokens=opt.max_new_tokens), shape)
        print(text)
        inferlet.send(text)
        if shape.logprobs >= 0:
            inferlet.send(json.dumps([[lp.token, lp.logprob, lp.top] for lp in ctx.logprobs]))
        if not (ctx.generated and ctx.generated[-1] in inferlet.stop_tokens()):
            inferlet.send("stopped: max_tokens")


WitWorld = inferlet.run(main)

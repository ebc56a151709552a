"""parallel-generation: one prompt, several continuations decoded side by side on forks.

The prompt is forwarded once by a flush (all but its last token, which stays pending: each
branch forwards that one with its suffix, so an empty suffix works too). Each branch forks the
prompt's context (full pages are shared, the partial last page is copied, the pending token is
carried over), appends its suffix and decodes greedily; the branches run concurrently, so their
forwards batch together. Branch i's tokens are those of decoding tokenize(PROMPT) +
tokenize(SUFFIX_i) alone. Sends one JSON message, in argument order:
[{"suffix": ..., "tokens": [ids], "text": ...}, ...].
"""

import json

import inferlet
from inferlet.arguments import whole

ARGS = inferlet.ArgumentParser("parallel-generation", __doc__)
ARGS.add_argument("prompt", metavar="PROMPT", help="the prompt the branches share")
ARGS.add_argument("max_new", metavar="MAX_NEW_TOKENS", type=whole(1), help="tokens at most per branch")
ARGS.add_argument("suffixes", metavar="SUFFIX", nargs="+", help="a branch's text after the prompt (may be empty)")


async def branch(prompt: inferlet.Context, suffix: str, max_new: int) -> dict:
    with await prompt.fork() as ctx:
        ctx.fill(suffix)
        text = await ctx.generate(inferlet.Greedy(), inferlet.Stop(max_tokens=max_new))
        return {"suffix": suffix, "tokens": ctx.generated, "text": text}


async def main(args: list[str]) -> None:
    opt = ARGS.parse(args)
    prompt_ids = inferlet.encode(opt.prompt)
    if not prompt_ids:
        ARGS.error("the prompt is empty")
    with inferlet.Context() as prompt:
        prompt.fill_tokens(prompt_ids)
        await prompt.flush()
        results = await inferlet.gather(*(branch(prompt, s, opt.max_new) for s in opt.suffixes))
    inferlet.send(json.dumps(results))


WitWorld = inferlet.run(main)

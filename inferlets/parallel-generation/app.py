"""parallel-generation: one prompt, several continuations decoded side by side on forks.

Arguments: PROMPT MAX_NEW_TOKENS SUFFIX [SUFFIX ...]

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

USAGE = "usage: parallel-generation PROMPT MAX_NEW_TOKENS SUFFIX [SUFFIX ...]"


async def branch(prompt: inferlet.Context, suffix: str, max_new: int) -> dict:
    with await prompt.fork() as ctx:
        ctx.fill(suffix)
        text = await ctx.generate(inferlet.Greedy(), inferlet.Stop(max_tokens=max_new))
        return {"suffix": suffix, "tokens": ctx.generated, "text": text}


async def main(args: list[str]) -> None:
    if len(args) < 3 or not args[1].isdigit() or int(args[1]) < 1:
        raise ValueError(USAGE)
    prompt_ids, max_new, suffixes = inferlet.encode(args[0]), int(args[1]), args[2:]
    if not prompt_ids:
        raise ValueError("the prompt is empty")
    with inferlet.Context() as prompt:
        prompt.fill_tokens(prompt_ids)
        await prompt.flush()
        results = await inferlet.gather(*(branch(prompt, s, max_new) for s in suffixes))
    inferlet.send(json.dumps(results))


WitWorld = inferlet.run(main)

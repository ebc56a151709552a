"""graph-of-thought: a thought per part on forks, merged pairwise, refined, scored; the best is kept.

Graph of Thoughts (Besta et al. 2023) on its split-and-merge pattern (the paper sorts sublists,
counts keywords per paragraph, merges documents): the input comes in K parts (2 to 6), and the four
operations, every one greedy and M tokens at most, are

* generate: the task is forwarded once; K forks of it each get "Part i: PART\\nThought i:" and
  write a thought on part i.
* aggregate: for every pair i < j, a fork of thought i's context (the task, part i and thought i,
  its pages shared) gets "\\nPart j: PART\\nThought j:" and thought j's tokens, then "\\nCombined
  thought:", and writes a thought that merges both: a context that holds both thoughts.
* refine: each combined thought's context gets "\\nRefined thought:" and writes it again, better.
* score: a refined thought's score is the mean log-probability of its tokens under the model (a
  final end token counts too); the best scores highest (the lower index on a tie) and is kept.

A thought that ends with an end token is taken without it wherever it is used. The operations of
one kind run side by side (their decode steps batch together). Every context is a list of tokens
made by joining the pieces' tokens (each piece encoded on its own), so a test can rebuild it.

Sends one JSON message: {"prefix": [the task's ids], "operations": [{"op": "generate",
"aggregate" or "refine", "sources": [operation indices it reads], "context": [the ids it generated
after], "tokens": [ids], "text", "score" (refine only)}], "best": index of the kept operation,
"answer": its text}. Operations are listed generate first (thought i at index i-1), then the
aggregates in pair order, then the refines in the same order.
"""

import json

import inferlet
from inferlet.arguments import text, whole

MAX_PARTS = 6  # 15 pairs: beyond this the pairwise merges dominate everything else
TASK_HEAD = "Task: {task}\n"
THOUGHT_CUE = "Part {i}: {part}\nThought {i}:"
OTHER_CUE = "\nPart {j}: {part}\nThought {j}:"
MERGE_CUE = "\nCombined thought:"
REFINE_CUE = "\nRefined thought:"

ARGS = inferlet.ArgumentParser("graph-of-thought", __doc__)
ARGS.add_argument("task", metavar="TASK", type=text, help="the task")
ARGS.add_argument("parts", metavar="PART", nargs="+", type=text, help=f"a part of the input (2 to {MAX_PARTS})")
ARGS.add_argument("--max-tokens", metavar="M", type=whole(1), default=16,
                  help="tokens at most per operation (default %(default)s)")


def body(tokens: list[int]) -> list[int]:
    """A thought's tokens without a final end token."""
    return tokens[:-1] if tokens and tokens[-1] in inferlet.stop_tokens() else tokens


async def write(ctx: inferlet.Context, op: str, sources: list[int], cue: list[int], max_tokens: int) -> dict:
    """Fill ``cue`` and decode greedily; ``ctx`` is left holding the context and the thought (no end token)."""
    ctx.fill_tokens(cue)
    context = ctx.tokens + ctx.pending
    text = await ctx.generate(inferlet.Greedy(), inferlet.Stop(max_tokens=max_tokens), inferlet.Shape(logprobs=0))
    tokens = list(ctx.generated)
    ctx.truncate(len(context) + len(body(tokens)))
    logprobs = [lp.logprob for lp in ctx.logprobs]
    return {"op": op, "sources": sources, "context": context, "tokens": tokens, "text": text,
            "mean_logprob": sum(logprobs) / len(logprobs)}


async def generate(root: inferlet.Context, i: int, part: str, max_tokens: int) -> tuple[dict, inferlet.Context]:
    ctx = await root.fork()
    return await write(ctx, "generate", [], inferlet.encode(THOUGHT_CUE.format(i=i, part=part)), max_tokens), ctx


async def aggregate(first: tuple[dict, inferlet.Context], second: dict, sources: list[int], j: int, part: str,
                    max_tokens: int) -> tuple[dict, inferlet.Context]:
    ctx = await first[1].fork()
    cue = inferlet.encode(OTHER_CUE.format(j=j, part=part)) + body(second["tokens"]) + inferlet.encode(MERGE_CUE)
    return await write(ctx, "aggregate", sources, cue, max_tokens), ctx


async def refine(merged: tuple[dict, inferlet.Context], source: int, max_tokens: int) -> dict:
    with merged[1] as ctx:
        return await write(ctx, "refine", [source], inferlet.encode(REFINE_CUE), max_tokens)


async def main(args: list[str]) -> None:
    opt = ARGS.parse(args)
    if not 2 <= len(opt.parts) <= MAX_PARTS:
        ARGS.error(f"give 2 to {MAX_PARTS} PARTs")
    task, parts, max_tokens = opt.task, opt.parts, opt.max_tokens
    k = len(parts)
    prefix = inferlet.encode(TASK_HEAD.format(task=task))
    with inferlet.Context() as root:
        root.fill_tokens(prefix)
        await root.flush()  # all but the last token: each fork feeds that one with its cue
        thoughts = await inferlet.gather(*(generate(root, i, part, max_tokens) for i, part in enumerate(parts, 1)))
    pairs = [(i, j) for i in range(k) for j in range(i + 1, k)]
    try:
        merged = await inferlet.gather(*(aggregate(thoughts[i], thoughts[j][0], [i, j], j + 1, parts[j], max_tokens)
                                         for i, j in pairs))
    finally:
        for _, ctx in thoughts:
            ctx.close()
    refined = await inferlet.gather(*(refine(m, k + n, max_tokens) for n, m in enumerate(merged)))
    operations = [t for t, _ in thoughts] + [m for m, _ in merged] + refined
    for r in refined:
        r["score"] = r["mean_logprob"]
    first_refine = k + len(pairs)
    best = max(range(first_refine, len(operations)), key=lambda n: (operations[n]["score"], -n))
    for op in operations:
        del op["mean_logprob"]
    inferlet.send(json.dumps({"prefix": prefix, "operations": operations, "best": best,
                              "answer": operations[best]["text"]}))


WitWorld = inferlet.run(main)

"""reflexion: attempt, check, reflect on a failure, retry with the reflections in memory.

Reflexion (Shinn et al. 2023). A memory context holds "Question: QUESTION\\n" and, one line each,
the reflections so far ("Reflection t:" and its text, then "\\n"). Trial t forks the memory (its
pages shared), gets "Answer:" and writes an attempt (greedy, M tokens at most). The checker passes
it when its text contains TEXT (--expect) or REGEX matches somewhere in it (--pattern). A failed
attempt, but the last, is reflected on in its own context: "\\nFeedback: the answer is wrong.\\n
Reflection:" after the attempt, and the model writes a reflection (greedy, R tokens at most) that is
added to the memory for the next trial. The feedback is the checker's verdict alone, as Reflexion's
binary reward: telling the model what was expected would hand it the answer. The trials stop at the
first that passes, or after N.

A text that ends with an end token is taken without it wherever it is used; every context is a list
of tokens made by joining the pieces' tokens (each piece encoded on its own), so a test can rebuild it.

Sends one JSON message: {"trials": [{"context": [the ids the attempt was written after], "tokens":
[ids], "text", "passed", "reflection": {"context", "tokens", "text"} or null}], "passed": whether a
trial passed, "answer": the passing attempt's text or null}.
"""

import json

import inferlet
from inferlet.arguments import regex, text, whole

QUESTION_HEAD = "Question: {question}\n"
ANSWER_CUE = "Answer:"
FEEDBACK = "\nFeedback: the answer is wrong.\nReflection:"
MEMORY_LINE = "Reflection {t}:"


ARGS = inferlet.ArgumentParser("reflexion", __doc__)
ARGS.add_argument("question", metavar="QUESTION", type=text, help="the question")
CHECKER = ARGS.add_mutually_exclusive_group(required=True)
CHECKER.add_argument("--expect", metavar="TEXT", type=text, help="an attempt passes when it contains TEXT")
CHECKER.add_argument("--pattern", metavar="REGEX", type=regex(), help="an attempt passes when REGEX matches in it")
ARGS.add_argument("--trials", metavar="N", type=whole(1), default=3, help="trials at most (default %(default)s)")
ARGS.add_argument("--max-tokens", metavar="M", type=whole(1), default=24,
                  help="tokens at most per attempt (default %(default)s)")
ARGS.add_argument("--reflection-tokens", metavar="R", type=whole(1), default=24,
                  help="tokens at most per reflection (default %(default)s)")


def passes(answer: str, opt) -> bool:
    return opt.expect in answer if opt.expect is not None else opt.pattern.search(answer) is not None


def body(tokens: list[int]) -> list[int]:
    """Generated tokens without a final end token."""
    return tokens[:-1] if tokens and tokens[-1] in inferlet.stop_tokens() else tokens


async def write(ctx: inferlet.Context, cue: list[int], max_tokens: int) -> dict:
    """Fill ``cue`` and decode greedily; ``ctx`` is left holding the context and the text (no end token)."""
    ctx.fill_tokens(cue)
    context = ctx.tokens + ctx.pending
    text = await ctx.generate(inferlet.Greedy(), inferlet.Stop(max_tokens=max_tokens))
    tokens = list(ctx.generated)
    ctx.truncate(len(context) + len(body(tokens)))
    return {"context": context, "tokens": tokens, "text": text}


async def trial(memory: inferlet.Context, t: int, reflect: bool, opt) -> dict:
    with await memory.fork() as ctx:
        attempt = await write(ctx, inferlet.encode(ANSWER_CUE), opt.max_tokens)
        attempt["passed"] = passes(attempt["text"], opt)
        attempt["reflection"] = None
        if not attempt["passed"] and reflect:
            attempt["reflection"] = await write(ctx, inferlet.encode(FEEDBACK), opt.reflection_tokens)
    return attempt


async def main(args: list[str]) -> None:
    opt = ARGS.parse(args)
    trials = []
    with inferlet.Context() as memory:
        memory.fill(QUESTION_HEAD.format(question=opt.question))
        for t in range(1, opt.trials + 1):
            trials.append(await trial(memory, t, t < opt.trials, opt))
            if trials[-1]["passed"]:
                break
            if trials[-1]["reflection"] is not None:
                lesson = body(trials[-1]["reflection"]["tokens"])
                memory.fill_tokens(inferlet.encode(MEMORY_LINE.format(t=t)) + lesson + inferlet.encode("\n"))
    passed = trials[-1]["passed"]
    inferlet.send(json.dumps({"trials": trials, "passed": passed, "answer": trials[-1]["text"] if passed else None}))


WitWorld = inferlet.run(main)

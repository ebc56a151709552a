"""reflexion: attempt, check, reflect on a failure, retry with the reflections in memory.

Arguments: QUESTION (--expect TEXT | --pattern REGEX) [--trials N=3] [--max-tokens M=24]
           [--reflection-tokens R=24]

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
import re

import inferlet

USAGE = ("usage: reflexion QUESTION (--expect TEXT | --pattern REGEX) [--trials N] [--max-tokens M] "
         "[--reflection-tokens R]")
QUESTION_HEAD = "Question: {question}\n"
ANSWER_CUE = "Answer:"
FEEDBACK = "\nFeedback: the answer is wrong.\nReflection:"
MEMORY_LINE = "Reflection {t}:"


def parse(args: list[str]) -> tuple[str, dict]:
    opt = {"--expect": None, "--pattern": None, "--trials": 3, "--max-tokens": 24, "--reflection-tokens": 24}
    positional, it = [], iter(args)
    try:
        for arg in it:
            if arg == "--expect":
                opt[arg] = next(it)
            elif arg == "--pattern":
                opt[arg] = re.compile(next(it))
            elif arg in opt:
                opt[arg] = int(next(it))
            elif arg.startswith("--"):
                raise ValueError(f"unknown option {arg}")
            else:
                positional.append(arg)
    except (StopIteration, ValueError, re.error) as exc:
        raise ValueError(f"{str(exc) or 'an option needs a value'}; {USAGE}") from None
    if len(positional) != 1 or not positional[0].strip():
        raise ValueError(f"give one non-empty QUESTION; {USAGE}")
    if (opt["--expect"] is None) == (opt["--pattern"] is None) or opt["--expect"] == "":
        raise ValueError(f"give one checker, a non-empty --expect or a --pattern; {USAGE}")
    if min(opt["--trials"], opt["--max-tokens"], opt["--reflection-tokens"]) < 1:
        raise ValueError(f"N, M and R must be >= 1; {USAGE}")
    return positional[0], opt


def passes(text: str, opt: dict) -> bool:
    return opt["--expect"] in text if opt["--expect"] is not None else opt["--pattern"].search(text) is not None


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


async def trial(memory: inferlet.Context, t: int, reflect: bool, opt: dict) -> dict:
    with await memory.fork() as ctx:
        attempt = await write(ctx, inferlet.encode(ANSWER_CUE), opt["--max-tokens"])
        attempt["passed"] = passes(attempt["text"], opt)
        attempt["reflection"] = None
        if not attempt["passed"] and reflect:
            attempt["reflection"] = await write(ctx, inferlet.encode(FEEDBACK), opt["--reflection-tokens"])
    return attempt


async def main(args: list[str]) -> None:
    question, opt = parse(args)
    trials = []
    with inferlet.Context() as memory:
        memory.fill(QUESTION_HEAD.format(question=question))
        for t in range(1, opt["--trials"] + 1):
            trials.append(await trial(memory, t, t < opt["--trials"], opt))
            if trials[-1]["passed"]:
                break
            if trials[-1]["reflection"] is not None:
                lesson = body(trials[-1]["reflection"]["tokens"])
                memory.fill_tokens(inferlet.encode(MEMORY_LINE.format(t=t)) + lesson + inferlet.encode("\n"))
    passed = trials[-1]["passed"]
    inferlet.send(json.dumps({"trials": trials, "passed": passed, "answer": trials[-1]["text"] if passed else None}))


WitWorld = inferlet.run(main)

"""skeleton-of-thought: a short skeleton of numbered points, then every point expanded at once.

Skeleton-of-Thought (Ning et al. 2023). The model first writes the skeleton of an answer: at most K
numbered points of a few words each, held to the form "1. ...\\n2. ...\\n" by a regex grammar (so
even a model that would wander writes points), S tokens at most; the complete lines are the points.
--skeleton gives the points instead (nothing is generated for them). The shared context is the start
of one user turn holding the question and the skeleton; each point i is expanded (greedy, M tokens
at most) from its own fork of that context, after the turn's end asking for point i alone and the
answer's start "i. POINT" (the paper's point-expanding prompt), so all the points decode side by side
and their steps batch together. The answer joins the expansions in order, one line per point.

--sequential expands the same points one after another on the shared context itself: expand, then
truncate it back to the shared tokens, then the next. It is the reference (and the baseline of
bench/skeleton_of_thought.py): every point gets the tokens the parallel run gives it.

Sends one JSON message: {"mode": "parallel" or "sequential", "skeleton": [points], "prefix": [the
shared context's ids], "expansions": [{"point", "cue": [ids after the prefix], "tokens": [ids],
"text"}], "answer": text, "expand_ms": wall time of the expansion}.
"""

import argparse
import json
import re

import inferlet
from inferlet.arguments import text, whole

SKELETON_PROMPT = (
    "You're an organizer responsible for only giving the skeleton (not the full content) for answering the "
    "question. Provide the skeleton in a list of points (numbered 1., 2., 3., etc.) to answer the question. "
    "Instead of writing a full sentence, each skeleton point should be very short with only 3~5 words.\n\n"
    "Question: {question}")
EXPAND_HEAD = ("You're responsible for continuing the writing of one and only one point in the overall answer to the "
               "following question.\n\n{question}\n\nThe skeleton of the answer is\n\n{skeleton}\n")
EXPAND_PROMPT = ("Continue and only continue the writing of point {i}. Write it **very shortly** in 1~2 sentences "
                 "and do not continue with other points!")
POINT_LINE = re.compile(r"\s*\d+\.\s*(\S.*?)\s*$")
POINT_TEXT = r"[^\s][^\n]{1,59}"  # a point in the skeleton grammar: a visible character, then up to 59 more


def skeleton_points(value: str) -> list[str]:
    named = [p.strip() for p in value.split("|") if p.strip()]
    if not named:
        raise argparse.ArgumentTypeError("must name a point")
    return named


ARGS = inferlet.ArgumentParser("skeleton-of-thought", __doc__)
ARGS.add_argument("question", metavar="QUESTION", type=text, help="the question to answer")
ARGS.add_argument("--points", metavar="K", type=whole(1), default=5,
                  help="the skeleton's points at most (default %(default)s)")
ARGS.add_argument("--skeleton-tokens", metavar="S", type=whole(1), default=160,
                  help="the skeleton's tokens at most (default %(default)s)")
ARGS.add_argument("--max-tokens", metavar="M", type=whole(1), default=48,
                  help="tokens per point's expansion at most (default %(default)s)")
ARGS.add_argument("--skeleton", metavar='"point|point|..."', type=skeleton_points,
                  help="the skeleton's points, separated by |, instead of the model's")
ARGS.add_argument("--sequential", action="store_true", help="expand the points one after another, on one context")


def skeleton_grammar(max_points: int) -> inferlet.Grammar:
    """'1. POINT\\n', then optionally '2. POINT\\n' and so on up to ``max_points``."""
    tail = ""
    for i in range(max_points, 1, -1):
        tail = f"(?:{i}\\. {POINT_TEXT}\\n{tail})?"
    return inferlet.Grammar.regex(f"1\\. {POINT_TEXT}\\n{tail}")


async def write_skeleton(question: str, opt: argparse.Namespace) -> list[str]:
    """The model's skeleton: the points of its complete lines (K at most)."""
    grammar = skeleton_grammar(opt.points)
    try:
        with inferlet.Context() as ctx:
            ctx.fill_chat([{"role": "user", "content": SKELETON_PROMPT.format(question=question)}])
            text = await ctx.generate(inferlet.Greedy(), inferlet.Stop(max_tokens=opt.skeleton_tokens),
                                      inferlet.Shape(grammar=grammar))
    finally:
        grammar.drop()
    complete = text[:text.rfind("\n") + 1]
    points = [m[1] for m in map(POINT_LINE.match, complete.splitlines()) if m]
    if not points:
        raise ValueError(f"the skeleton has no complete point within {opt.skeleton_tokens} tokens: {text!r}")
    return points[:opt.points]


def conversation(question: str, points: list[str]) -> tuple[str, list[str]]:
    """The shared text (one user turn's start: the question and the skeleton) and each point's cue after
    it (the turn's end, asking for that point, and the answer's start)."""
    head = EXPAND_HEAD.format(question=question, skeleton="".join(f"{i}. {p}\n" for i, p in enumerate(points, 1)))
    shared, cues = None, []
    for i, point in enumerate(points, 1):
        whole = inferlet.render_chat([{"role": "user", "content": head + EXPAND_PROMPT.format(i=i)}])
        at = whole.find(head)
        if at < 0 or (shared is not None and whole[:at + len(head)] != shared):
            raise ValueError("the chat template does not keep a user turn's text as it is")
        shared = whole[:at + len(head)]
        cues.append(whole[len(shared):] + f"{i}. {point}")
    return shared, cues


async def expand(ctx: inferlet.Context, cue: list[int], max_tokens: int) -> dict:
    """Fill ``cue`` and decode greedily; the point's tokens and text."""
    ctx.fill_tokens(cue)
    text = await ctx.generate(inferlet.Greedy(), inferlet.Stop(max_tokens=max_tokens))
    return {"cue": cue, "tokens": list(ctx.generated), "text": text}


async def expand_forked(shared: inferlet.Context, cue: list[int], max_tokens: int) -> dict:
    with await shared.fork() as ctx:
        return await expand(ctx, cue, max_tokens)


async def main(args: list[str]) -> None:
    opt = ARGS.parse(args)
    question = opt.question
    points = opt.skeleton or await write_skeleton(question, opt)
    shared_text, cue_texts = conversation(question, points)
    prefix, cues = inferlet.encode(shared_text), [inferlet.encode(c) for c in cue_texts]
    max_tokens = opt.max_tokens
    with inferlet.Context() as shared:
        shared.fill_tokens(prefix)
        await shared.flush()  # all but the last token: each expansion feeds that one with its cue
        start = inferlet.now_ms()
        if opt.sequential:
            expansions = []
            for cue in cues:
                expansions.append(await expand(shared, cue, max_tokens))
                shared.truncate(len(prefix))  # back to the question and the skeleton
        else:
            expansions = await inferlet.gather(*(expand_forked(shared, cue, max_tokens) for cue in cues))
        expand_ms = inferlet.now_ms() - start
    for point, expansion in zip(points, expansions):
        expansion["point"] = point
    answer = "\n".join(f"{i}. {e['point']}{e['text']}" for i, e in enumerate(expansions, 1))
    inferlet.send(json.dumps({"mode": "sequential" if opt.sequential else "parallel", "skeleton": points,
                              "prefix": prefix, "expansions": expansions, "answer": answer, "expand_ms": expand_ms}))


WitWorld = inferlet.run(main)

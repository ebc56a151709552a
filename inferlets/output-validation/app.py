"""output-validation: how probable each of N candidate strings is as the model's continuation of a prompt.

As Pie's output-validation: a candidate's score is the sum of its tokens' log-probabilities after the
prompt (the candidate tokenized alone, as the inferlet would fill it), and the probabilities are those
scores softmax-normalised over the candidates, so they sum to 1. With --chat the prompt is a user
message in the model's chat template, the candidates the assistant's reply.

The prompt is forwarded once; each candidate runs on a fork of its context (full pages shared), one
step per token, all candidates' steps batched together. A step is ``shaped_step`` with the
candidate's next token as the only allowed token: the server draws it, so the context moves on along
the candidate, and returns its log-probability under the model's own distribution (log-softmax over
the whole vocabulary, before the mask), exact rather than read from a top-K list. Sends one JSON
message: {"candidates": [{"text", "tokens", "logprob", "probability"}, ...] in the order given,
"best": the index of the most probable}.
"""

import json
import math

import inferlet
from inferlet.arguments import text

ARGS = inferlet.ArgumentParser("output-validation", __doc__)
ARGS.add_argument("prompt", metavar="PROMPT", type=text, help="the prompt")
ARGS.add_argument("candidates", metavar="CANDIDATE", nargs="+", help="a continuation to score (one token or more)")
ARGS.add_argument("--chat", action="store_true", help="PROMPT is a user turn of the chat template")


async def score(root: inferlet.Context, tokens: list[int]) -> float:
    """The summed log-probability of ``tokens`` after ``root``'s tokens, on a fork of it."""
    with await root.fork() as ctx:
        for token in tokens:
            await ctx.shaped_step(inferlet.Shape(allowed=frozenset((token,)), logprobs=0))
        return math.fsum(lp.logprob for lp in ctx.logprobs)


def normalise(logprobs: list[float]) -> list[float]:
    """Softmax over the candidates' scores (in binary64; a candidate of zero probability gets 0)."""
    top = max(logprobs)
    if top == -math.inf:
        return [1 / len(logprobs)] * len(logprobs)
    weights = [math.exp(lp - top) for lp in logprobs]
    total = math.fsum(weights)
    return [w / total for w in weights]


async def main(args: list[str]) -> None:
    opt = ARGS.parse(args)
    prompt, candidates = opt.prompt, opt.candidates
    token_lists = [inferlet.encode(c) for c in candidates]
    if any(not tokens for tokens in token_lists):
        ARGS.error("every CANDIDATE must hold at least one token")
    with inferlet.Context() as root:
        root.fill_chat([{"role": "user", "content": prompt}]) if opt.chat else root.fill(prompt)
        await root.flush()  # the prompt, once: every fork shares its pages
        logprobs = await inferlet.gather(*(score(root, tokens) for tokens in token_lists))
    probs = normalise(logprobs)
    inferlet.send(json.dumps({
        "candidates": [{"text": c, "tokens": t, "logprob": lp, "probability": pr}
                       for c, t, lp, pr in zip(candidates, token_lists, logprobs, probs)],
        "best": max(range(len(probs)), key=probs.__getitem__),
    }))


WitWorld = inferlet.run(main)

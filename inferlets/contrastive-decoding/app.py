"""contrastive-decoding: greedy on log p_expert - log p_amateur over the expert's plausible tokens.

Contrastive decoding (Li et al. 2023) pits a strong expert against a weak amateur. oven serves one
model, so a LoRA adapter stands in for the second: the expert is the model through adapter NAME and
the amateur the base model (--reverse swaps them). Each holds the prompt in a context of its own
(an adapter changes the K/V, so they share no pages), and both forward each step side by side, so
their forwards batch together. Each step, the plausible tokens are those with p_expert >= A * max
p_expert (Li et al.'s plausibility constraint, which keeps the amateur's dislikes from promoting
nonsense); the next token is the plausible one of highest log p_expert - log p_amateur (a tie: the
one the expert finds more probable), fed to both. Both distributions are the whole vocabulary's:
any token may be plausible, and the amateur's probability of each is needed. Stops after M tokens
or at an end token (kept in "tokens").

Sends one JSON message: {"tokens": [ids], "text": the text without end tokens, "plausible": [how many
tokens were plausible, per step], "scores": [the chosen token's log-ratio, per step]}.
"""

import json
import math

import inferlet
from inferlet.arguments import number, text, whole

ARGS = inferlet.ArgumentParser("contrastive-decoding", __doc__)
ARGS.add_argument("prompt", metavar="PROMPT", type=text, help="the text to continue")
ARGS.add_argument("--adapter", metavar="NAME", type=text, required=True,
                  help="the LoRA adapter that plays the expert (the amateur with --reverse)")
ARGS.add_argument("--max-tokens", metavar="M", type=whole(1), default=16, help="tokens at most (default %(default)s)")
ARGS.add_argument("--alpha", metavar="A", type=number(0, 1), default=0.1,
                  help="the plausibility floor, a share of the expert's top probability (default %(default)s)")
ARGS.add_argument("--reverse", action="store_true", help="the base model is the expert, the adapter the amateur")
ARGS.add_argument("--chat", action="store_true", help="PROMPT is a user turn of the chat template")


def choose(expert, amateur, alpha: float) -> tuple[int, int, float]:
    """(token, how many were plausible, its score) from the two whole-vocabulary distributions."""
    floor = alpha * expert.probs[0]
    amateur_p = dict(zip(amateur.token_ids, amateur.probs))
    best, plausible, best_score = expert.token_ids[0], 0, -math.inf
    for token, p in zip(expert.token_ids, expert.probs):  # most probable first: the plausible are a prefix
        if p < floor or p == 0:
            break
        plausible += 1
        q = amateur_p[token]
        score = math.inf if q == 0 else math.log(p) - math.log(q)
        if score > best_score:  # strictly: a tie keeps the token the expert ranks higher
            best, best_score = token, score
    return best, plausible, best_score


async def main(args: list[str]) -> None:
    opt = ARGS.parse(args)
    adapter = inferlet.open_adapter(opt.adapter)
    expert_adapter, amateur_adapter = (0, adapter) if opt.reverse else (adapter, 0)
    vocab, stops = inferlet.vocab_size(), inferlet.stop_tokens()
    out = {"tokens": [], "plausible": [], "scores": []}
    with inferlet.Context(adapter=expert_adapter) as expert, inferlet.Context(adapter=amateur_adapter) as amateur:
        for ctx in (expert, amateur):
            if opt.chat:
                ctx.fill_chat([{"role": "user", "content": opt.prompt}])
            else:
                ctx.fill(opt.prompt)
        await inferlet.gather(expert.flush(), amateur.flush())
        while len(out["tokens"]) < opt.max_tokens and not (out["tokens"] and out["tokens"][-1] in stops):
            e, a = await inferlet.gather(expert.next_dist(vocab), amateur.next_dist(vocab))
            token, plausible, score = choose(e, a, opt.alpha)
            for ctx in (expert, amateur):
                ctx.fill_tokens([token])
            out["tokens"].append(token)
            out["plausible"].append(plausible)
            out["scores"].append(score)
    out["text"] = inferlet.decode([t for t in out["tokens"] if t not in stops])
    inferlet.send(json.dumps(out))


WitWorld = inferlet.run(main)

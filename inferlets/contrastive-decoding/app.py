"""contrastive-decoding: greedy on log p_expert - log p_amateur over the expert's plausible tokens.

Arguments: PROMPT --adapter NAME [--max-tokens M=16] [--alpha A=0.1] [--reverse] [--chat]

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

USAGE = "usage: contrastive-decoding PROMPT --adapter NAME [--max-tokens M] [--alpha A] [--reverse] [--chat]"


def parse(args: list[str]) -> tuple[str, dict]:
    opt = {"--adapter": None, "--max-tokens": 16, "--alpha": 0.1, "--reverse": False, "--chat": False}
    positional, it = [], iter(args)
    try:
        for arg in it:
            if arg in ("--reverse", "--chat"):
                opt[arg] = True
            elif arg == "--adapter":
                opt[arg] = next(it)
            elif arg == "--max-tokens":
                opt[arg] = int(next(it))
            elif arg == "--alpha":
                opt[arg] = float(next(it))
            elif arg.startswith("--"):
                raise ValueError(f"unknown option {arg}")
            else:
                positional.append(arg)
    except (StopIteration, ValueError) as exc:
        raise ValueError(f"{str(exc) or 'an option needs a value'}; {USAGE}") from None
    if len(positional) != 1 or not positional[0]:
        raise ValueError(f"give one non-empty PROMPT; {USAGE}")
    if not opt["--adapter"]:
        raise ValueError(f"give the --adapter that plays the expert (the amateur with --reverse); {USAGE}")
    if opt["--max-tokens"] < 1 or not 0 <= opt["--alpha"] <= 1:
        raise ValueError(f"M must be >= 1 and A in [0, 1]; {USAGE}")
    return positional[0], opt


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
    prompt, opt = parse(args)
    adapter = inferlet.open_adapter(opt["--adapter"])
    expert_adapter, amateur_adapter = (0, adapter) if opt["--reverse"] else (adapter, 0)
    vocab, stops = inferlet.vocab_size(), inferlet.stop_tokens()
    out = {"tokens": [], "plausible": [], "scores": []}
    with inferlet.Context(adapter=expert_adapter) as expert, inferlet.Context(adapter=amateur_adapter) as amateur:
        for ctx in (expert, amateur):
            if opt["--chat"]:
                ctx.fill_chat([{"role": "user", "content": prompt}])
            else:
                ctx.fill(prompt)
        await inferlet.gather(expert.flush(), amateur.flush())
        while len(out["tokens"]) < opt["--max-tokens"] and not (out["tokens"] and out["tokens"][-1] in stops):
            e, a = await inferlet.gather(expert.next_dist(vocab), amateur.next_dist(vocab))
            token, plausible, score = choose(e, a, opt["--alpha"])
            for ctx in (expert, amateur):
                ctx.fill_tokens([token])
            out["tokens"].append(token)
            out["plausible"].append(plausible)
            out["scores"].append(score)
    out["text"] = inferlet.decode([t for t in out["tokens"] if t not in stops])
    inferlet.send(json.dumps(out))


WitWorld = inferlet.run(main)

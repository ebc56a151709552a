"""speculative-ngram: n-gram prompt-lookup speculative decoding, verified in one forward per step.

Arguments: PROMPT [MAX_NEW_TOKENS=32] [--ngram N=3] [--draft K=4].

Each step drafts up to K tokens with ``ngram.lookup`` (what followed an earlier occurrence of
the context's last n <= N tokens) and forwards the pending token and the draft together:
``Context.dists`` gives the next-token distribution after each of them, so the longest prefix
of the draft that greedy decoding agrees with is accepted, plus the model's own next token
(the correction, or one more when all were accepted). Rejected slots are truncated away and
rewritten by the next step. The output is greedy decoding's; what drafting saves is forwards.

Sends one JSON message: {"tokens": [...], "drafted": D, "accepted": A, "acceptance_rate": A/D,
"forward_calls": F}, F counting the prefill. Stops after MAX_NEW_TOKENS or an end token.
"""

import json

import inferlet
from ngram import lookup

USAGE = "usage: speculative-ngram PROMPT [MAX_NEW_TOKENS] [--ngram N>=1] [--draft K>=0]"


def parse(args: list[str]) -> tuple[str, int, int, int]:
    def option(name: str, default: int) -> int:
        if name not in args:
            return default
        at = args.index(name) + 1
        if at >= len(args) or not args[at].isdigit():
            raise ValueError(f"{name} needs a whole number; {USAGE}")
        return int(args[at])

    if not args or args[0].startswith("--"):
        raise ValueError(USAGE)
    if len(args) > 1 and not args[1].startswith("--") and not args[1].isdigit():
        raise ValueError(f"MAX_NEW_TOKENS must be a whole number, not {args[1]!r}; {USAGE}")
    max_new = int(args[1]) if len(args) > 1 and args[1].isdigit() else 32
    max_n, k = option("--ngram", 3), option("--draft", 4)
    if max_new < 1 or max_n < 1:
        raise ValueError(USAGE)
    return args[0], max_new, max_n, k


async def main(args: list[str]) -> None:
    prompt, max_new, max_n, k = parse(args)
    end = inferlet.stop_tokens()
    with inferlet.Context() as ctx:
        ctx.fill(prompt)
        generated = [await ctx.decode_step()]  # the prefill; the token stays pending
        forwards, drafted, accepted = 1, 0, 0
        while len(generated) < max_new and generated[-1] not in end:
            draft = lookup(ctx.tokens + ctx.pending, max_n, min(k, max_new - len(generated) - 1))
            base = len(ctx)  # through the pending (last generated) token
            ctx.fill_tokens(draft)
            predicted = [dist.token_ids[0] for dist in await ctx.dists(top_k=1)]
            forwards += 1
            agree = 0
            while agree < len(draft) and draft[agree] == predicted[agree]:
                agree += 1
            new = draft[:agree] + [predicted[agree]]
            for i, token in enumerate(new):
                if token in end:
                    new = new[:i + 1]
                    break
            kept = min(agree, len(new))  # less than agree when an end token came first
            drafted, accepted = drafted + len(draft), accepted + kept
            ctx.truncate(base + kept)  # drop the rejected draft slots
            if len(new) > kept:
                ctx.fill_tokens(new[-1:])
            generated += new
    inferlet.send(json.dumps({"tokens": generated, "drafted": drafted, "accepted": accepted,
                              "acceptance_rate": accepted / drafted if drafted else 0.0,
                              "forward_calls": forwards}))


WitWorld = inferlet.run(main)

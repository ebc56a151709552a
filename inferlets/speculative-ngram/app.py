"""speculative-ngram: n-gram prompt-lookup speculative decoding, verified in one forward per step.

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
from inferlet.arguments import text, whole
from ngram import lookup

ARGS = inferlet.ArgumentParser("speculative-ngram", __doc__)
ARGS.add_argument("prompt", metavar="PROMPT", type=text, help="the text to continue")
ARGS.add_argument("max_new_tokens", metavar="MAX_NEW_TOKENS", nargs="?", type=whole(1), default=32,
                  help="tokens at most (default %(default)s)")
ARGS.add_argument("--ngram", metavar="N", type=whole(1), default=3,
                  help="the longest n-gram looked up (default %(default)s)")
ARGS.add_argument("--draft", metavar="K", type=whole(0), default=4,
                  help="draft tokens per step at most (default %(default)s)")


async def main(args: list[str]) -> None:
    opt = ARGS.parse(args)
    prompt, max_new, max_n, k = opt.prompt, opt.max_new_tokens, opt.ngram, opt.draft
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

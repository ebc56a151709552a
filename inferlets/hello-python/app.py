"""hello-python: greedy generation on the raw oven API (no SDK).

Arguments: PROMPT [MAX_NEW_TOKENS=32] [--chat] [--pause] [--fused]. Prints the completion to
stdout and sends the generated token ids to the client as one message ("1 2 3").
With --pause it waits for a client message after the prompt is prefilled, holding
its KV pages idle meanwhile (what an agent waiting on a tool does). With --fused
every step is one forward-text call (the fast path) instead of three calls.

The host drives the inferlet: ``start``/``resume`` run the generator ``main``
until it yields the futures it waits on. Every decode step issues embed-text,
forward and get-next-dist back to back on queue 0 and waits only for the last:
the queue keeps them in order.
"""

from oven_inferlet import wait_all, world
from wit_world.imports import embeds, forward, futures, kvpages, messaging, runtime, tokenize

QUEUE = 0
BASE_MODEL = 0  # the adapter argument of forward calls: no LoRA adapter


def main():
    args = runtime.arguments()
    if not args:
        raise ValueError("usage: hello-python PROMPT [MAX_NEW_TOKENS] [--chat]")
    max_new = int(args[1]) if len(args) > 1 and args[1].isdigit() else 32
    prompt = tokenize.render_chat(["user"], [args[0]], True) if "--chat" in args else args[0]
    tokens = tokenize.tokenize(prompt)
    stop = set(tokenize.stop_tokens())
    page_size = runtime.page_size()

    want_pages = kvpages.alloc_kvpages(QUEUE, (len(tokens) + max_new + page_size - 1) // page_size)
    want_embeds = embeds.alloc_embeds(QUEUE, len(tokens) + 1)
    yield from wait_all([want_pages, want_embeds])
    pages, slots = futures.take_handles(want_pages), futures.take_handles(want_embeds)
    output = slots[-1]

    generated, context = [], 0
    step_tokens = tokens
    while len(generated) < max_new:
        inputs = slots[: len(step_tokens)]
        positions = list(range(context, context + len(step_tokens)))
        context += len(step_tokens)
        used = pages[: (context + page_size - 1) // page_size]
        last_len = context - (len(used) - 1) * page_size
        if "--fused" in args:
            dist = forward.forward_text(QUEUE, step_tokens, positions, used, last_len, [len(step_tokens) - 1], 1,
                                        BASE_MODEL)
            yield [dist]
        else:
            embedded = embeds.embed_text(QUEUE, step_tokens, positions, inputs)
            forwarded = forward.forward(QUEUE, used, last_len, inputs, [len(inputs) - 1], [output], [], BASE_MODEL)
            dist = forward.get_next_dist(QUEUE, output, 1)
            yield [dist]
            futures.take_unit(embedded)  # completed before dist (same queue); raises on error
            futures.take_unit(forwarded)
        token = futures.take_dists(dist)[0].token_ids[0]
        generated.append(token)
        if "--pause" in args and len(generated) == 1:
            message = messaging.receive()
            yield from wait_all([message])
            futures.take_text(message)
        if token in stop:
            break
        step_tokens = [token]
    print(tokenize.detokenize([t for t in generated if t not in stop]))
    messaging.send(" ".join(str(t) for t in generated))


WitWorld = world(main)

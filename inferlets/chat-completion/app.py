"""chat-completion: one OpenAI-style completion request, run as an inferlet.

``oven serve --openai-port`` runs one instance of it per HTTP request; it can be run by hand too:

    oven run chat-completion -- '{"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 8}'

Argument: one JSON object with ``messages`` (chat: a list of {"role", "content"}, through the
model's chat template) or ``prompt`` (plain text), and optionally ``max_tokens`` (16),
``temperature`` (1.0; 0 is greedy), ``top_p`` (1.0), ``seed`` (choice i samples with seed + i),
``stop`` (strings), ``n`` (1) and ``stream`` (false). For the OpenAI endpoint's tool calls (AsyncLM's
CML, client/openai_api/tools.py): ``adapter``, the name of a LoRA adapter to decode on; ``prefix``,
texts the assistant's turn already holds, each tokenized on its own; ``wait``, the text with which
the model waits for a result (``[TRAP][END]``), and ``results``, texts given to it one per wait
(as AsyncLM's interrupts): a wait with no result left ends the choice (its text left out).

It sends JSON messages to the client: first ``{"prompt_tokens": N}``; with ``stream``, text as it is
generated, ``{"index": i, "text": DELTA}``; and last for each choice ``{"index": i, "text": REST,
"finish_reason": "stop" | "length", "completion_tokens": K}`` (REST: all its text without
``stream``, else what was held back). A choice of n > 1 forks the prompt's context, so the prompt
is forwarded once and the choices decode in one batch.
"""

import json
import random

import inferlet

DEFAULTS = {"max_tokens": 16, "temperature": 1.0, "top_p": 1.0, "seed": None, "stop": [], "n": 1, "stream": False,
            "adapter": None, "prefix": [], "wait": None, "results": []}


def sampler_for(request: dict, index: int) -> inferlet.Sampler:
    temperature, top_p, seed = request["temperature"], request["top_p"], request["seed"]
    if temperature == 0:
        return inferlet.Greedy()
    # No seed: a fresh one per choice (OpenAI's requests without a seed are not repeatable).
    seed = random.SystemRandom().getrandbits(64) if seed is None else seed + index
    if top_p < 1:
        return inferlet.TopP(top_p, temperature, seed)
    return inferlet.Temperature(temperature, seed)


def held_back(text: str, stops: list[str]) -> int:
    """How many characters at the end of ``text`` may still become a stop string (or a split character)."""
    if text.endswith("\ufffd"):  # an incomplete UTF-8 sequence: its next token completes it
        return len(text) - len(text.rstrip("\ufffd"))
    longest = 0
    for stop in stops:
        for size in range(min(len(stop) - 1, len(text)), longest, -1):
            if text.endswith(stop[:size]):
                longest = size
                break
    return longest


async def complete(ctx: inferlet.Context, request: dict, index: int) -> None:
    """Decode one choice on ``ctx`` and send its text."""
    sampler, stops, end = sampler_for(request, index), request["stop"], inferlet.stop_tokens()
    wait, results = request["wait"], list(request["results"])
    generated, shown, sent, finish = [], [], 0, "length"
    text = before = ""  # before: the text of earlier stretches, between which results went in
    while len(generated) < request["max_tokens"]:
        token = await ctx.decode_step(sampler)
        generated.append(token)
        if token in end:
            finish = "stop"
            break
        shown.append(token)
        text = before + inferlet.decode(shown)
        waits = text.find(wait, len(before)) if wait else -1
        if waits >= 0:  # the model waits for a result: the next one goes in, or the choice ends here
            text = text[:waits]
            if not results:
                finish = "stop"
                break
            ctx.fill(results.pop(0))
            before, shown = text, []
            continue
        cut = min((at for at in (text.find(s) for s in stops) if at >= 0), default=-1)
        if cut >= 0:
            text, finish = text[:cut], "stop"
            break
        if request["stream"]:
            ready = len(text) - held_back(text, stops)
            if ready > sent:
                inferlet.send(json.dumps({"index": index, "text": text[sent:ready]}))
                sent = ready
    inferlet.send(json.dumps({"index": index, "text": text[sent:], "finish_reason": finish,
                              "completion_tokens": len(generated)}))


async def forked(prompt: inferlet.Context, request: dict, index: int) -> None:
    with await prompt.fork() as ctx:
        await complete(ctx, request, index)


async def main(args: list[str]) -> None:
    if len(args) != 1:
        raise SystemExit("usage: chat-completion REQUEST_JSON")
    try:
        request = {**DEFAULTS, **json.loads(args[0])}
    except ValueError as exc:
        raise SystemExit(f"chat-completion: the request is not JSON: {exc}") from None
    try:
        adapter = inferlet.open_adapter(request["adapter"]) if request["adapter"] else 0
    except inferlet.OvenError as exc:
        raise SystemExit(f"chat-completion: adapter {request['adapter']!r}: {exc}") from None
    with inferlet.Context(adapter=adapter) as ctx:
        if "messages" in request:
            ctx.fill_chat(request["messages"])
        else:
            ctx.fill(request["prompt"])
        for segment in request["prefix"]:
            ctx.fill(segment)
        inferlet.send(json.dumps({"prompt_tokens": len(ctx)}))
        if request["n"] == 1:  # decode on the prompt's own context: the same calls as text-completion
            await complete(ctx, request, 0)
            return
        await ctx.flush()  # forward all but the last token once; each fork feeds that one itself
        await inferlet.gather(*(forked(ctx, request, i) for i in range(request["n"])))


WitWorld = inferlet.run(main)

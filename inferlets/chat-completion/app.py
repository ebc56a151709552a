"""chat-completion: one OpenAI-style completion request, run as an inferlet.

``oven serve --openai-port`` runs one instance of it per HTTP request; it can be run by hand too:

    oven run chat-completion -- '{"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 8}'

Argument: one JSON object with ``messages`` (chat: a list of {"role", "content"}, through the
model's chat template) or ``prompt`` (plain text), and optionally ``max_tokens`` (16),
``temperature`` (1.0; 0 is greedy), ``top_p`` (1.0), ``top_k`` (0: off), ``min_p`` (0: off; not with
``top_p`` below 1), ``seed`` (choice i samples with seed + i), ``stop`` (strings), ``n`` (1) and
``stream`` (false). The server draws each token (a built-in sampler, pipelined) shaped by
``inferlet.Shape`` when any of these is set: ``grammar`` ([kind, spec] of ``inferlet.Grammar``),
``logit_bias`` ({token id: added logit}), ``presence_penalty`` and ``frequency_penalty`` (OpenAI's),
``repetition_penalty`` (vLLM's), ``logprobs`` (-1: none; N >= 0: each token's log-probability and
its N most probable). For the OpenAI endpoint's tool calls (AsyncLM's CML,
client/openai_api/tools.py): ``adapter``, the name of a LoRA adapter to decode on; ``prefix``, texts
the assistant's turn already holds, each tokenized on its own; ``wait``, the text with which the
model waits for a result (``[TRAP][END]``), and ``results``, texts given to it one per wait (as
AsyncLM's interrupts): a wait with no result left ends the choice (its text left out). Each stretch
between two results is one generation (penalties count within it); ``grammar_stretches`` "last"
holds only the one after the last result to the grammar; ``one_call`` ends the choice after the
first call the model writes (``[CALL] ... [END]``).

``prompt`` may be a list of texts: each gets ``n`` choices, prompt k's numbered from k * n. With
``max_context`` (a prompt and its completion together) and ``max_prompt_tokens`` (one prompt), a request
past them ends once the prompts' sizes are sent, before any forward: the client that set them words
the refusal.

It sends JSON messages to the client: first ``{"prompt_tokens": N, "prompts": [N1, ...]}`` (the
total, then each prompt's), or ``{"error": {"message",
"param"}}`` for a request it cannot serve (a grammar that does not compile: the server's reason; a
token id outside the vocabulary); with ``stream``, text as it is generated, ``{"index": i, "text":
DELTA}``; and last for each choice ``{"index": i, "text": REST, "finish_reason": "stop" | "length",
"completion_tokens": K}`` (REST: all its text without ``stream``, else what was held back). With
``logprobs``, each text message has ``"logprobs": [[token, logprob, [[token, logprob], ...]], ...]``
for the tokens whose text it completes (a token's text is its own decoding; end tokens and tokens
past a stop string are left out). A choice of n > 1 forks the prompt's context, so the prompt is
forwarded once and the choices decode in one batch.
"""

import json
import random
from dataclasses import dataclass

import inferlet

DEFAULTS = {"max_tokens": 16, "temperature": 1.0, "top_p": 1.0, "top_k": 0, "min_p": 0.0, "seed": None, "stop": [],
            "n": 1, "stream": False, "adapter": None, "prefix": [], "wait": None, "results": [], "one_call": False,
            "grammar": None, "grammar_param": None, "grammar_stretches": "all", "logit_bias": {},
            "presence_penalty": 0.0, "frequency_penalty": 0.0, "repetition_penalty": 1.0, "logprobs": -1}
LOWEST_LOGPROB = -9999.0  # OpenAI's floor for a log-probability (JSON has no -infinity)


class RequestError(Exception):
    """A request this inferlet cannot serve; ``param`` names the request parameter at fault."""

    def __init__(self, message: str, param: str | None):
        super().__init__(message)
        self.param = param


def sampler_for(request: dict, index: int) -> inferlet.Sampler:
    temperature, top_k, top_p, min_p = request["temperature"], request["top_k"], request["top_p"], request["min_p"]
    if temperature == 0:
        return inferlet.Greedy()
    # No seed: a fresh one per choice (OpenAI's requests without a seed are not repeatable).
    seed = random.SystemRandom().getrandbits(64) if request["seed"] is None else request["seed"] + index
    if min_p > 0:
        sampler = inferlet.MinP(min_p, temperature, seed)
    elif top_p < 1:
        sampler = inferlet.TopP(top_p, temperature, seed)
    elif top_k > 0:
        return inferlet.TopK(top_k, temperature, seed)
    else:
        sampler = inferlet.Temperature(temperature, seed)
    if top_k > 0:  # the server's distribution is then the k most probable: top-k first, as vLLM
        sampler.top_k = top_k
    return sampler


class Shaping:
    """What each generation of the request is shaped with: its grammar (made once, checked by the
    server), biases, penalties and log-probabilities."""

    def __init__(self, request: dict):
        self.grammar, self.stretches = None, request["grammar_stretches"]
        if request["grammar"]:
            kind, spec = request["grammar"]
            try:
                self.grammar = inferlet.Grammar(kind, spec)
            except inferlet.OvenError as exc:
                raise RequestError(f"the {request['grammar_param'] or 'grammar'} cannot be used: {exc}",
                                   request["grammar_param"]) from None
        vocab, self.bias = inferlet.vocab_size(), {}
        for key, value in request["logit_bias"].items():
            if not 0 <= int(key) < vocab:
                raise RequestError(f"logit_bias: token {key} is not in this model's vocabulary (0 to {vocab - 1})",
                                   "logit_bias")
            self.bias[int(key)] = float(value)
        self.penalties = (float(request["presence_penalty"]), float(request["frequency_penalty"]),
                          float(request["repetition_penalty"]))
        self.logprobs = int(request["logprobs"])

    def shape(self, last: bool) -> inferlet.Shape | None:
        """The Shape of a stretch (``last``: after the turn's last result), or None when nothing shapes it."""
        grammar = self.grammar if self.stretches == "all" or last else None
        if grammar is None and not self.bias and self.penalties == (0.0, 0.0, 1.0) and self.logprobs < 0:
            return None
        presence, frequency, repetition = self.penalties
        return inferlet.Shape(grammar=grammar, bias=self.bias, presence_penalty=presence,
                              frequency_penalty=frequency, repetition_penalty=repetition, logprobs=self.logprobs)


@dataclass(frozen=True)
class EachToken(inferlet.Stop):
    """A stop decided token by token: while ``strings`` holds any, the SDK asks ``find_string`` after
    every token it draws (Context.generate_tokens, pipelined or not), with that token last in
    ``ctx.generated``; ``seen`` is handed it then (to stream it) and ends the generation with True."""

    strings: tuple = ("\0",)  # never looked for: find_string below decides
    seen: object = None

    def find_string(self, text: str):
        return 0 if self.seen() else None


_texts: dict[int, str] = {}


def token_text(token: int) -> str:
    if token not in _texts:
        _texts[token] = inferlet.decode([token])
    return _texts[token]


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


class Choice:
    """One choice's text as its tokens arrive: streamed (less what may become a stop string), cut at a
    stop string or at a wait, with each token's log-probabilities."""

    def __init__(self, ctx: inferlet.Context, request: dict, index: int):
        self.ctx, self.index, self.stream = ctx, index, request["stream"]
        self.stops, self.wait, self.one_call = request["stop"], request["wait"], request["one_call"]
        self.keep_logprobs, self.end = request["logprobs"] >= 0, inferlet.stop_tokens()
        self.text = self.before = ""  # before: the text of earlier stretches, between which results went in
        self.shown: list[int] = []  # this stretch's tokens, end tokens left out
        self.sent = 0  # characters of text sent
        self.entries: list[tuple[int, int, list]] = []  # per token shown: (start, end) in text, its entry
        self.logged = 0  # entries sent
        self.generated = 0  # tokens drawn, all stretches
        self.looked = 0  # tokens of this stretch's generation taken
        self.finish: str | None = None  # "stop", or "wait" at a wait

    def seen(self) -> bool:
        """Tokens were drawn (the SDK asks after each one but the last of its budget or an end token:
        ``complete`` hands those over after the generation); True ends the stretch."""
        drawn = self.ctx.generated
        while self.looked < len(drawn) and self.finish is None:
            self.looked += 1
            self.take(drawn[self.looked - 1], self.looked - 1)
        return self.finish is not None

    def take(self, token: int, index: int) -> None:
        """The stretch's token ``index`` (its log-probabilities are ``ctx.logprobs[index]``)."""
        if token in self.end:
            self.finish = "stop"
            return
        start = len(self.text)
        self.shown.append(token)
        text = self.before + inferlet.decode(self.shown)
        if self.keep_logprobs:
            record = self.ctx.logprobs[index]
            top = [[token_text(t), max(lp, LOWEST_LOGPROB)] for t, lp in record.top]
            self.entries.append((start, len(text), [token_text(token), max(record.logprob, LOWEST_LOGPROB), top]))
        waits = text.find(self.wait, len(self.before)) if self.wait else -1
        if waits >= 0:  # the model waits for a result: the next one goes in, or the choice ends here
            self.text, self.finish = text[:waits], "wait"
            return
        if self.one_call:  # parallel_tool_calls false: the first call the model wrote ends its reply
            call = text.find("[CALL]", len(self.before))
            ends = text.find("[END]", call) if call >= 0 else -1
            if ends >= 0:
                self.text, self.finish = text[:ends + len("[END]")], "stop"
                return
        cut = min((at for at in (text.find(s) for s in self.stops) if at >= 0), default=-1)
        if cut >= 0:
            self.text, self.finish = text[:cut], "stop"
            return
        self.text = text
        if self.stream:
            ready = len(text) - held_back(text, self.stops)
            if ready > self.sent:
                self.send(ready)

    def next_stretch(self) -> None:
        self.before, self.shown, self.finish, self.looked = self.text, [], None, 0

    def send(self, upto: int, **last) -> None:
        """Send the text up to ``upto`` and the entries of the tokens it completes (``last``: the
        choice's last message, with every entry of a token that began before the text's end)."""
        done = self.logged
        while done < len(self.entries) and (self.entries[done][1] <= upto or last and self.entries[done][0] < upto):
            done += 1
        message = {"index": self.index, "text": self.text[self.sent:upto], **last}
        if self.keep_logprobs:
            message["logprobs"] = [entry for _, _, entry in self.entries[self.logged:done]]
        inferlet.send(json.dumps(message))
        self.sent, self.logged = upto, done


async def complete(ctx: inferlet.Context, request: dict, index: int, shaping: Shaping) -> None:
    """Decode one choice on ``ctx`` and send its text."""
    sampler, choice, results = sampler_for(request, index), Choice(ctx, request, index), list(request["results"])
    while choice.generated < request["max_tokens"]:
        stop = EachToken(max_tokens=request["max_tokens"] - choice.generated, seen=choice.seen)
        choice.generated += len(await ctx.generate_tokens(sampler, stop, shaping.shape(last=not results)))
        choice.seen()
        if choice.finish != "wait":
            break
        if not results:
            choice.finish = "stop"
            break
        ctx.fill(results.pop(0))
        choice.next_stretch()
    choice.send(len(choice.text), finish_reason=choice.finish or "length", completion_tokens=choice.generated)


async def forked(prompt: inferlet.Context, request: dict, index: int, shaping: Shaping) -> None:
    with await prompt.fork() as ctx:
        await complete(ctx, request, index, shaping)


async def choices(ctx: inferlet.Context, request: dict, first: int, shaping: Shaping) -> None:
    """The ``n`` choices of one prompt, numbered from ``first``."""
    if request["n"] == 1:  # decode on the prompt's own context: the same calls as text-completion
        await complete(ctx, request, first, shaping)
        return
    await ctx.flush()  # forward all but the last token once; each fork feeds that one itself
    await inferlet.gather(*(forked(ctx, request, first + i, shaping) for i in range(request["n"])))


def too_long(request: dict, prompt_tokens: list[int]) -> bool:
    """Past the limits the client gave (``max_context``, ``max_prompt_tokens``): it refuses the request
    from the sizes sent, so nothing is forwarded."""
    context, prompt = request.get("max_context"), request.get("max_prompt_tokens")
    return any(context is not None and n + request["max_tokens"] > context or prompt is not None and n > prompt
               for n in prompt_tokens)


async def main(args: list[str]) -> None:
    if len(args) != 1:
        raise SystemExit("usage: chat-completion REQUEST_JSON")
    try:
        request = {**DEFAULTS, **json.loads(args[0])}
    except ValueError as exc:
        raise SystemExit(f"chat-completion: the request is not JSON: {exc}") from None
    try:
        shaping = Shaping(request)
    except RequestError as exc:
        inferlet.send(json.dumps({"error": {"message": str(exc), "param": exc.param}}))
        return
    try:
        adapter = inferlet.open_adapter(request["adapter"]) if request["adapter"] else 0
    except inferlet.OvenError as exc:
        raise SystemExit(f"chat-completion: adapter {request['adapter']!r}: {exc}") from None
    prompts = [None] if "messages" in request else \
        [request["prompt"]] if isinstance(request["prompt"], str) else request["prompt"]
    contexts = [inferlet.Context(adapter=adapter) for _ in prompts]
    try:
        for ctx, prompt in zip(contexts, prompts):
            if prompt is None:
                ctx.fill_chat(request["messages"])
            else:
                ctx.fill(prompt)
            for segment in request["prefix"]:
                ctx.fill(segment)
        sizes = [len(ctx) for ctx in contexts]
        inferlet.send(json.dumps({"prompt_tokens": sum(sizes), "prompts": sizes}))
        if too_long(request, sizes):
            return
        n = request["n"]
        await inferlet.gather(*(choices(ctx, request, k * n, shaping) for k, ctx in enumerate(contexts)))
    finally:
        for ctx in contexts:
            ctx.close()


WitWorld = inferlet.run(main)

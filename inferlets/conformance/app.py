"""conformance: SDK scenarios on the Python SDK, one JSON message each; ``conformance-rust`` is its
twin on the Rust SDK, and ``tests/test_sdk_conformance.py`` runs both and compares their messages.

Arguments: one scenario each, its fields separated by "|":

* ``generate|SAMPLER|PROMPT|MAX[|token=ID][|string=TEXT][|noeos]`` -> tokens, text, page handles
* ``steps|SAMPLER|PROMPT|MAX``: decode_step by decode_step after a flush -> tokens, page handles
* ``fork|PROMPT|N|MAX``: N forks of the prompt, each then samples MAX tokens (top-k 50, seed =
  its index) concurrently -> page handles after forking and after generating, tokens
* ``drop|PROMPT|START|END``: a fork hides tokens [START, END), then shows them again -> page
  handles, top-5 distributions while hidden and after
* ``share|PROMPT|MAX``: the prompt's pages exported, imported by a second context; both generate
  greedily -> token count, page handles, tokens, the error importing after the release
* ``snapshot|PROMPT|MORE|MAX``: the prompt's forwarded pages saved as a snapshot; a context
  ``from_prefix`` of PROMPT + MORE reuses them and a fork of it writes past them, both generating
  greedily; then a context ``from_snapshot`` gets the prompt's last token and generates -> token
  count, tokens reused, page handles, tokens, the errors saving the name again and opening it
  after the drop
* ``truncate|PROMPT|MAX|KEEP``: generate, truncate to KEEP tokens, generate again -> tokens, pages
* ``kv|PROMPT|STEPS|MAX|MODE``: prefill, STEPS decode steps (a page prefetched), then MODE
  (``offload`` and restore, ``evict``, ``ahead``: free the pages allocated ahead, or ``pause``:
  a pause hint of 20 ms and a sleep as long), then generate
  greedily -> page handles after MODE, tokens, page handles
* ``ahead|PROMPT|MAX|TOKEN``: generate up to MAX tokens, stopping at TOKEN, then free the pages
  allocated ahead -> tokens, page handles before and after
* ``pipelined|SAMPLER|PROMPT|MAX[|token=ID][|string=TEXT][|noeos]``: ``generate`` as the Python SDK
  runs a built-in sampler (the server samples, one step in flight ahead) and as it runs a custom
  one (the same sampler wrapped: the inferlet samples, step by step), each in a context of its
  own, then 3 tokens more with the same sampler and the top-5 distribution after them -> for
  each path the text, tokens, context state and the sampler's generator state
* ``dists|PROMPT|K``: one distribution per prompt token -> their token ids
* ``adapter|NAME|PROMPT|MAX``: a context on LoRA adapter NAME, a fork of it and a context on the
  base model generate greedily, concurrently -> the adapter's id, the three token lists, the error
  opening an adapter that does not exist
* ``vectors``: the seeded-sampling test vectors of sdk/README.md, computed here
* ``errors``: the messages of an empty decode, a bad drop range and a missing import
* ``launch|PROGRAM|PROMPT|MAX``: two children of PROGRAM with arguments PROMPT MAX, the second
  cancelled at once, both awaited -> each one's exit (state, code, error, messages), the error
  launching a program that does not exist
* ``shaped|SAMPLER|PROMPT|MAX|GRAMMAR[|logprobs=N][|penalties=P:F:R][|allowed=IDS][|bias=BIAS][|stop options]``:
  ``generate`` under a Shape (GRAMMAR: ``none``, ``json``, ``json-schema:SCHEMA``, ``regex:PATTERN``,
  ``lark:GRAMMAR`` or ``choice:A,B,...``; IDS ``1,2,...``; BIAS ``ID:VALUE,...``, ``-inf`` bans), then 3
  tokens more greedily, unshaped -> tokens, text, log-probabilities, page handles, the sampler's
  generator state, the 3 tokens
* ``masked|SAMPLER|PROMPT|STEPS|IDS|BIAS|N``: STEPS ``shaped_step``s, each allowing the tokens of IDS
  not drawn yet, biased by BIAS, with N log-probabilities -> tokens, log-probabilities, page
  handles, the generator state
* ``shape_errors``: the messages of an unknown grammar kind, a bad regex, an empty choice, a Shape
  with a custom sampler, penalties in ``shaped_step``, an allowed token outside the vocabulary and a
  presence penalty out of range

SAMPLER is ``greedy``, ``temperature:T:SEED``, ``top_k:K:T:SEED``, ``top_p:P:T:SEED`` or
``min_p:P:T:SEED``.
"""

import json
import struct

import inferlet

GREEDY = inferlet.Greedy()


def sampler(spec: str) -> inferlet.Sampler:
    kind, *values = spec.split(":")
    if kind == "greedy":
        return GREEDY
    *params, seed = values
    if kind == "temperature":
        return inferlet.Temperature(float(params[0]), int(seed))
    if kind == "top_k":
        return inferlet.TopK(int(params[0]), float(params[1]), int(seed))
    if kind == "top_p":
        return inferlet.TopP(float(params[0]), float(params[1]), int(seed))
    if kind == "min_p":
        return inferlet.MinP(float(params[0]), float(params[1]), int(seed))
    raise ValueError(f"unknown sampler {spec!r}")


def stop(max_tokens: str, options: list[str]) -> inferlet.Stop:
    tokens = [int(o[6:]) for o in options if o.startswith("token=")]
    strings = [o[7:] for o in options if o.startswith("string=")]
    return inferlet.Stop(max_tokens=int(max_tokens), eos="noeos" not in options, strings=tuple(strings),
                         tokens=tuple(tokens))


def handles(ctx: inferlet.Context) -> list[int]:
    return list(ctx.pages.handles)


def dist_json(dist) -> dict:
    return {"token_ids": list(dist.token_ids), "probs": list(dist.probs)}


async def generate(spec, prompt, max_tokens, *options):
    with inferlet.Context() as ctx:
        ctx.fill(prompt)
        text = await ctx.generate(sampler(spec), stop(max_tokens, list(options)))
        return {"tokens": ctx.generated, "text": text, "pages": handles(ctx)}


async def steps(spec, prompt, max_tokens):
    with inferlet.Context() as ctx:
        ctx.fill(prompt)
        await ctx.flush()
        chosen = sampler(spec)
        tokens = [await ctx.decode_step(chosen) for _ in range(int(max_tokens))]
        return {"tokens": tokens, "pages": handles(ctx)}


async def fork(prompt, n, max_tokens):
    with inferlet.Context() as root:
        root.fill(prompt)
        contexts = [root]
        for _ in range(int(n)):
            contexts.append(await root.fork())
        after_fork = [handles(c) for c in contexts]
        tokens = await inferlet.gather(*(c.generate_tokens(inferlet.TopK(50, 1.0, i), inferlet.Stop(int(max_tokens)))
                                         for i, c in enumerate(contexts)))
        after_generate = [handles(c) for c in contexts]
        for c in contexts[1:]:
            c.close()
    return {"after_fork": after_fork, "tokens": tokens, "after_generate": after_generate}


async def drop(prompt, start, end):
    with inferlet.Context() as root:
        root.fill(prompt)
        await root.flush()
        with await root.fork() as child:
            before = handles(child)
            await child.drop_range(int(start), int(end))
            hidden = await child.next_dist(5)
            await child.undrop_range(int(start), int(end))
            shown = await child.next_dist(5)
            after = handles(child)
        root_dist = await root.next_dist(5)
        return {"before": before, "after": after, "root": handles(root), "hidden": dist_json(hidden),
                "shown": dist_json(shown), "root_dist": dist_json(root_dist)}


async def share(prompt, max_tokens):
    name = "conformance/" + inferlet.instance_id()
    tokens = inferlet.encode(prompt)
    with inferlet.Context() as exporter:
        exporter.fill_tokens(tokens)
        await exporter.flush()
        count = await exporter.export(name)
        with inferlet.Context.imported(name, tokens[:count]) as importer:
            importer.fill_tokens(tokens[count:])
            imported = handles(importer)
            generated = await inferlet.gather(
                *(c.generate_tokens(GREEDY, inferlet.Stop(int(max_tokens))) for c in (exporter, importer)))
            after = [handles(exporter), handles(importer)]
        inferlet.Context.release_export(name)
        try:
            inferlet.Context.imported(name, tokens[:count])
            missing = None
        except inferlet.OvenError as err:
            missing = str(err)
        return {"count": count, "imported": imported, "tokens": generated, "after": after, "missing": missing}


async def snapshot(prompt, more, max_tokens):
    name = "conformance/snapshot/" + inferlet.instance_id()
    tokens, stop = inferlet.encode(prompt), inferlet.Stop(int(max_tokens))
    with inferlet.Context() as maker:
        maker.fill_tokens(tokens)
        await maker.flush()
        count = await maker.snapshot(name)
        try:
            await maker.snapshot(name)
            taken = None
        except inferlet.OvenError as err:
            taken = str(err)
    with inferlet.Context.from_prefix(tokens + inferlet.encode(more)) as reuser:
        reused, pages = len(reuser.tokens), handles(reuser)
        with await reuser.fork() as forked:
            generated = await inferlet.gather(*(c.generate_tokens(GREEDY, stop) for c in (reuser, forked)))
            after = [handles(reuser), handles(forked)]
    with inferlet.Context.from_snapshot(name) as opened:
        opened.fill_tokens(tokens[count:])
        generated.append(await opened.generate_tokens(GREEDY, stop))
    inferlet.Context.drop_snapshot(name)
    try:
        inferlet.Context.from_snapshot(name)
        missing = None
    except inferlet.OvenError as err:
        missing = str(err)
    return {"count": count, "reused": reused, "pages": pages, "tokens": generated, "after": after,
            "taken": taken, "missing": missing}


async def truncate(prompt, max_tokens, keep):
    with inferlet.Context() as ctx:
        ctx.fill(prompt)
        first = await ctx.generate_tokens(GREEDY, inferlet.Stop(int(max_tokens)))
        ctx.truncate(int(keep))
        pages = handles(ctx)
        second = await ctx.generate_tokens(GREEDY, inferlet.Stop(int(max_tokens)))
        return {"tokens": [first, second], "truncated_pages": pages, "pages": handles(ctx)}


async def kv(prompt, steps, max_tokens, mode):
    with inferlet.Context() as ctx:
        ctx.fill(prompt)
        await ctx.flush()
        for _ in range(int(steps)):
            await ctx.decode_step(GREEDY)
        if mode == "offload":
            await ctx.offload()
            await ctx.restore()
        elif mode == "evict":
            ctx.evict()
        elif mode == "pause":  # a short tool call, announced
            ctx.pause_hint(20)
            await inferlet.sleep(20)
        else:
            ctx.free_pages_ahead()
        after = handles(ctx)
        tokens = await ctx.generate_tokens(GREEDY, inferlet.Stop(int(max_tokens)))
        return {"after": after, "tokens": tokens, "pages": handles(ctx)}


async def ahead(prompt, max_tokens, token):
    with inferlet.Context() as ctx:
        ctx.fill(prompt)
        tokens = await ctx.generate_tokens(GREEDY, inferlet.Stop(int(max_tokens), tokens=(int(token),)))
        before = handles(ctx)
        ctx.free_pages_ahead()
        return {"tokens": tokens, "before": before, "after": handles(ctx)}


async def dists(prompt, k):
    with inferlet.Context() as ctx:
        ctx.fill(prompt)
        return {"token_ids": [list(d.token_ids) for d in await ctx.dists(int(k))]}


async def adapter(name, prompt, max_tokens):
    adapter_id = inferlet.open_adapter(name)
    with inferlet.Context(adapter=adapter_id) as adapted, inferlet.Context() as base:
        adapted.fill(prompt)
        base.fill(prompt)
        await adapted.flush()
        with await adapted.fork() as forked:
            tokens = await inferlet.gather(
                *(c.generate_tokens(GREEDY, inferlet.Stop(int(max_tokens))) for c in (adapted, forked, base)))
    try:
        inferlet.open_adapter("no-such-adapter")
        missing = None
    except inferlet.OvenError as err:
        missing = str(err)
    return {"id": adapter_id, "adapted": tokens[0], "forked": tokens[1], "base": tokens[2], "missing": missing}


async def vectors():
    rng = inferlet.Rng(1234567)
    u64 = [rng.next_u64() for _ in range(3)]
    rng = inferlet.Rng(42)
    f64 = [rng.next_f64() for _ in range(3)]
    probs = [struct.unpack("<f", struct.pack("<f", p))[0] for p in (0.4, 0.3, 0.15, 0.1, 0.05)]
    samplers = {"temperature-1": inferlet.Temperature(1.0, 7), "temperature-0.7": inferlet.Temperature(0.7, 7),
                "top-k": inferlet.TopK(3, 1.5, 7), "top-p": inferlet.TopP(0.8, 0.7, 7),
                "min-p": inferlet.MinP(0.3, 1.0, 7), "temperature-0": inferlet.Temperature(0.0, 7)}
    draws = {name: "".join(str(s.sample([0, 1, 2, 3, 4], probs)) for _ in range(20)) for name, s in samplers.items()}
    return {"u64": u64, "f64": f64, "draws": draws}


class Stepwise(inferlet.Sampler):
    """A built-in sampler run by the inferlet: a custom sampler keeps ``generate`` step by step."""

    def __init__(self, inner: inferlet.Sampler):
        self.inner, self.top_k = inner, inner.top_k

    def sample(self, token_ids, probs):
        return self.inner.sample(token_ids, probs)


async def pipelined(spec, prompt, max_tokens, *options):
    report = {}
    for path in ("pipelined", "stepwise"):
        chosen = sampler(spec) if spec != "greedy" else inferlet.Greedy()
        with inferlet.Context() as ctx:
            ctx.fill(prompt)
            run_by = chosen if path == "pipelined" else Stepwise(chosen)
            text = await ctx.generate(run_by, stop(max_tokens, list(options)))
            state = {"text": text, "generated": list(ctx.generated), "tokens": list(ctx.tokens),
                     "pending": list(ctx.pending),
                     "num_pages": len(ctx.pages.handles), "rng": getattr(getattr(chosen, "rng", None), "state", None)}
            state["more"] = await ctx.generate_tokens(chosen, inferlet.Stop(3, eos=False))
            state["dist"] = dist_json(await ctx.next_dist(5))
            report[path] = state
    return report


def grammar(spec: str) -> inferlet.Grammar | None:
    kind, _, text = spec.partition(":")
    if kind == "none":
        return None
    if kind == "json":
        return inferlet.Grammar.json()
    if kind == "json-schema":
        return inferlet.Grammar.json_schema(text)
    if kind == "regex":
        return inferlet.Grammar.regex(text)
    if kind == "lark":
        return inferlet.Grammar.lark(text)
    if kind == "choice":
        return inferlet.Grammar.choice(text.split(","))
    raise ValueError(f"unknown grammar {spec!r}")


def bias_of(spec: str) -> dict[int, float]:
    return {int(token): float(value) for token, value in (item.split(":") for item in spec.split(",") if item)}


def ids_of(spec: str) -> list[int]:
    return [int(token) for token in spec.split(",") if token]


def logprobs_json(ctx: inferlet.Context) -> list:
    return [[lp.token, lp.logprob, [list(pair) for pair in lp.top]] for lp in ctx.logprobs]


def rng_state(chosen: inferlet.Sampler):
    return getattr(getattr(chosen, "rng", None), "state", None)


async def shaped(spec, prompt, max_tokens, grammar_spec, *options):
    fields = dict(o.split("=", 1) for o in options if o.startswith(("logprobs=", "penalties=", "allowed=", "bias=")))
    presence, frequency, repetition = (float(v) for v in fields.get("penalties", "0:0:1").split(":"))
    chosen = sampler(spec) if spec != "greedy" else inferlet.Greedy()
    g = grammar(grammar_spec)
    shape = inferlet.Shape(grammar=g, allowed=frozenset(ids_of(fields["allowed"])) if "allowed" in fields else None,
                           bias=bias_of(fields.get("bias", "")), presence_penalty=presence,
                           frequency_penalty=frequency, repetition_penalty=repetition,
                           logprobs=int(fields.get("logprobs", "-1")))
    with inferlet.Context() as ctx:
        ctx.fill(prompt)
        text = await ctx.generate(chosen, stop(max_tokens, list(options)), shape)
        report = {"tokens": list(ctx.generated), "text": text, "logprobs": logprobs_json(ctx), "pages": handles(ctx),
                  "rng": rng_state(chosen)}
        report["more"] = await ctx.generate_tokens(GREEDY, inferlet.Stop(3, eos=False))
    if g is not None:
        g.drop()
    return report


async def masked(spec, prompt, steps, ids, bias, logprobs):
    chosen = sampler(spec) if spec != "greedy" else inferlet.Greedy()
    allowed = ids_of(ids)
    with inferlet.Context() as ctx:
        ctx.fill(prompt)
        tokens = []
        for _ in range(int(steps)):
            shape = inferlet.Shape(allowed=frozenset(t for t in allowed if t not in tokens), bias=bias_of(bias),
                                   logprobs=int(logprobs))
            tokens.append(await ctx.shaped_step(shape, chosen))
        return {"tokens": tokens, "logprobs": logprobs_json(ctx), "pages": handles(ctx), "rng": rng_state(chosen)}


async def shape_errors():
    messages = {}
    attempts = {
        "kind": lambda: inferlet.Grammar("xml", "<a/>"),
        "regex": lambda: inferlet.Grammar.regex("("),
        "choice": lambda: inferlet.Grammar.choice([]),
    }
    for name, attempt in attempts.items():
        try:
            attempt()
        except (ValueError, inferlet.OvenError) as err:
            messages[name] = str(err)
    with inferlet.Context() as ctx:
        ctx.fill("one two three")
        shapes = {"custom": (Stepwise(inferlet.Greedy()), inferlet.Shape()),
                  "allowed": (GREEDY, inferlet.Shape(allowed=frozenset({inferlet.vocab_size()}))),
                  "presence": (GREEDY, inferlet.Shape(presence_penalty=5.0))}
        for name, (chosen, shape) in shapes.items():
            try:
                await ctx.generate(chosen, inferlet.Stop(2), shape)
            except (ValueError, inferlet.OvenError) as err:
                messages[name] = str(err)
        try:
            await ctx.shaped_step(inferlet.Shape(repetition_penalty=1.2), GREEDY)
        except ValueError as err:
            messages["step"] = str(err)
        messages["pages"] = handles(ctx)
    return messages


async def errors():
    messages = {}
    with inferlet.Context() as ctx:
        try:
            await ctx.next_dist()
        except ValueError as err:
            messages["empty"] = str(err)
        ctx.fill("one two three")
        try:
            await ctx.drop_range(0, len(ctx))
        except ValueError as err:
            messages["range"] = str(err)
    try:
        inferlet.Context.imported("conformance/none", [1, 2])
    except inferlet.OvenError as err:
        messages["import"] = str(err)
    return messages


async def launch(program, prompt, max_tokens):
    finished = inferlet.launch(program, [prompt, max_tokens])
    cancelled = inferlet.launch(program, [prompt, max_tokens])
    cancelled.cancel()
    report = {}
    for name, child in (("finished", finished), ("cancelled", cancelled)):
        report[name] = (await child.wait())._asdict()
    try:
        inferlet.launch("no-such-program", [])
    except inferlet.OvenError as err:
        report["refused"] = str(err)
    return report


SCENARIOS = {f.__name__: f for f in (generate, steps, fork, drop, share, snapshot, truncate, kv, ahead, pipelined, dists,
                                      adapter, vectors, errors, launch, shaped, masked, shape_errors)}


async def main(args: list[str]) -> None:
    for arg in args:
        kind, *fields = arg.split("|")
        inferlet.send(json.dumps(await SCENARIOS[kind](*fields)))


WitWorld = inferlet.run(main)

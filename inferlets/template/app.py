"""template: the model fills a template's holes in place; its fixed text is forwarded, never decoded.

TEMPLATE is text with holes. `{name}` is one line the model writes: it ends at a newline, at an end
token, or where the model writes the first word or punctuation mark of the text after the hole (so in
"{city}, {country}" the city ends at a comma). `{name:REGEX}` is held to REGEX by the server's grammar
mask and ends when REGEX has matched (a pattern's braces must pair). `{{` and `}}` are literal braces.
PROMPT is an optional instruction before the template: raw text, or with --chat one user turn, the
template then being the assistant's reply.

The fixed text between two holes goes into the context as it is and is forwarded with the next hole's
first step, however long it is, instead of being drawn a token at a time. After each hole the context
gets the value's own tokens in place of those the model drew (which can run past the hole's end), so
it holds the filled template, each piece tokenized on its own: prompt, fixed text, value, fixed text...
The spaces that end the fixed text before a hole are the hole's to draw (a model writes a space with
the word after it, and a lone space token leads it astray): the hole is written after the fixed text
without them, a pattern's hole must start with them, and the value is what follows them.

Prints the filled template and sends one JSON message: {"text": the filled template, "fields": {name:
value}, "holes": [{"name", "context": [the ids the hole was written after], "tokens": [the ids drawn],
"value"}], "unfinished": [holes that ran out of tokens first], "fixed_tokens": tokens of the fixed text before
the last hole (forwarded), "drawn_tokens": tokens drawn}.
"""

import json
import re
import string

import inferlet
from inferlet.arguments import number, text, whole

MAX_HOLES = 32  # each regex hole holds one of the instance's 64 grammars
NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
FIRST_WORD = re.compile(r"[ \t]*(?:\w+|[^\w\s])")

ARGS = inferlet.ArgumentParser("template", __doc__)
ARGS.add_argument("template", metavar="TEMPLATE", type=text, help="the text, with {name} and {name:REGEX} holes")
ARGS.add_argument("prompt", metavar="PROMPT", nargs="?", default="", help="an instruction before the template")
ARGS.add_argument("--chat", action="store_true", help="PROMPT is a user turn; the template is the reply")
ARGS.add_argument("--max-tokens", metavar="M", type=whole(1), default=32,
                  help="tokens at most per hole (default %(default)s)")
ARGS.add_argument("--temperature", metavar="T", type=number(0), help="sample at temperature T (default: greedy)")
ARGS.add_argument("--seed", metavar="S", type=whole(0), default=0,
                  help="hole i samples with seed S + i, with --temperature (default %(default)s)")


def pieces(template: str) -> tuple[list[str], list[tuple[str, str]]]:
    """The fixed texts and the holes between them: fixed[0], hole 0, fixed[1], ..., fixed[-1]."""
    fixed, holes = [""], []
    try:
        parsed = list(string.Formatter().parse(template))
    except ValueError as err:
        ARGS.error(f"TEMPLATE: {err} (write {{{{ and }}}} for literal braces)")
    for literal, name, pattern, conversion in parsed:
        fixed[-1] += literal
        if name is None:
            continue
        if not NAME.fullmatch(name) or conversion is not None:
            ARGS.error(f"TEMPLATE: a hole is {{name}} or {{name:REGEX}}, name a Python identifier; not "
                       f"{{{name}{'!' + conversion if conversion else ''}}}")
        if name in (hole for hole, _ in holes):
            ARGS.error(f"TEMPLATE: the hole {name!r} appears twice")
        holes.append((name, pattern))
        fixed.append("")
    if not holes:
        ARGS.error("TEMPLATE has no hole: {name} or {name:REGEX}")
    if len(holes) > MAX_HOLES:
        ARGS.error(f"TEMPLATE has {len(holes)} holes; at most {MAX_HOLES}")
    return fixed, holes


def ends(after: str) -> tuple[str, ...]:
    """A plain hole's stop strings: a newline, and the first word or punctuation mark of the text after
    it with the spaces before that (a model writes a space with the word after it)."""
    head = FIRST_WORD.match(after)
    return ("\n", head.group(0)) if head else ("\n",)


def split_space(before: str) -> tuple[str, str]:
    """The text before a hole, and the spaces and tabs that end it: those go with the hole, drawn by the
    model (which writes a space with the word after it; a lone space token leads it astray)."""
    text = before.rstrip(" \t")
    return text, before[len(text):]


async def main(args: list[str]) -> None:
    opt = ARGS.parse(args)
    fixed, holes = pieces(opt.template)
    if not opt.prompt and not fixed[0]:
        ARGS.error("the first hole needs text before it: a PROMPT or fixed text at the template's start")
    plans = []  # per hole: its name, the fixed text before it without its spaces, the spaces, when it ends
    for (name, pattern), before, after in zip(holes, fixed, fixed[1:]):
        text, space = split_space(before)
        if pattern:
            try:
                inferlet.Grammar.regex(pattern).drop()  # alone first: an error quotes the pattern as given
                grammar = inferlet.Grammar.regex(space + f"(?:{pattern})")  # " " and "\t" need no escape
            except inferlet.OvenError as err:
                ARGS.error(f"the hole {name!r}: {err}")
            stop, shape = inferlet.Stop(max_tokens=opt.max_tokens), inferlet.Shape(grammar=grammar)
        else:
            stop, shape = inferlet.Stop(max_tokens=opt.max_tokens, strings=ends(after)), None
        plans.append((name, text, space, stop, shape))
    with inferlet.Context() as ctx:
        if opt.chat:
            ctx.fill_chat([{"role": "user", "content": opt.prompt}])
        elif opt.prompt:
            ctx.fill(opt.prompt)
        report, unfinished, fixed_tokens = [], [], 0
        for i, (name, text, space, stop, shape) in enumerate(plans):
            piece = inferlet.encode(text)
            ctx.fill_tokens(piece)
            fixed_tokens += len(piece)
            context = ctx.tokens + ctx.pending
            sampler = (inferlet.Temperature(opt.temperature, opt.seed + i) if opt.temperature is not None
                       else inferlet.Greedy())
            written = await ctx.generate(sampler, stop, shape)
            drawn = list(ctx.generated)
            ended = bool(drawn) and drawn[-1] in inferlet.stop_tokens()
            if not ended and not (stop.strings and stop.find_string(inferlet.decode(drawn)) is not None):
                unfinished.append(name)
            value = written[len(space):] if written.startswith(space) else written
            ctx.truncate(len(context))
            ctx.fill_tokens(inferlet.encode(space + value))
            report.append({"name": name, "context": context, "tokens": drawn, "value": value})
    filled = "".join(before + hole["value"] for before, hole in zip(fixed, report)) + fixed[-1]
    print(filled)
    inferlet.send(json.dumps({"text": filled, "fields": {hole["name"]: hole["value"] for hole in report},
                              "holes": report, "unfinished": unfinished, "fixed_tokens": fixed_tokens,
                              "drawn_tokens": sum(len(hole["tokens"]) for hole in report)}))


WitWorld = inferlet.run(main)

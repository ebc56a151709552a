"""knowledge-graph: a passage's facts extracted as triples, a graph of them, the facts near what the
question names, and an answer from those facts alone.

1. Extract: one user turn asks for the passage's facts as lines of "subject | relation | object"; the
   reply is greedy and held to that form by the grammar mask (at most F lines, each part 1 to 32
   characters and no full stop), so every line parses.
2. Graph: the triples' subjects and objects are the nodes (parts stripped; a name is one node however
   it is capitalized, spelled as first seen), each triple an edge.
3. Retrieve: from the seed entities (--entity, else the nodes whose names the question contains, else
   every node) a breadth-first walk along edges both ways, D hops deep, collects each edge it crosses
   as a fact "subject relation object"; the facts are sorted and each kept once.
4. Answer: a fresh user turn holds the facts and the question; the reply is greedy, M tokens at most.

Sends one JSON message: {"extraction": {"prompt": the user turn, "pattern": the grammar's regex,
"text"}, "triples": [[subject, relation, object]], "seeds": [names], "facts": [...], "answer":
{"prompt": the user turn, "tokens": [ids], "text"}}.
"""

import json

import inferlet
from inferlet.arguments import text, whole

MAX_FACTS = 64
NAME = r"[A-Z0-9][A-Za-z0-9'-]{0,15}(?: [A-Z0-9][A-Za-z0-9'-]{0,15}){0,3}"  # capitalized words, not a sentence
RELATION = r"[a-z]{1,15}(?: [a-z]{1,15}){0,4}"
EXTRACT = ("List the facts in the passage, one per line, as: subject | relation | object\n"
           "For example: Rome | is the capital of | Italy\n\nPassage: {passage}")
ASK = "Facts:\n{facts}\n\nAnswer from these facts only. {question}"

ARGS = inferlet.ArgumentParser("knowledge-graph", __doc__)
ARGS.add_argument("passage", metavar="PASSAGE", type=text, help="the text to extract facts from")
ARGS.add_argument("question", metavar="QUESTION", type=text, help="the question to answer")
ARGS.add_argument("--entity", metavar="NAME", type=text, action="append",
                  help="start the walk at NAME (repeatable; default: the nodes the question names)")
ARGS.add_argument("--depth", metavar="D", type=whole(1, 8), default=2, help="hops from the seeds (default %(default)s)")
ARGS.add_argument("--max-facts", metavar="F", type=whole(1, MAX_FACTS), default=12,
                  help="triples extracted at most (default %(default)s)")
ARGS.add_argument("--max-tokens", metavar="M", type=whole(1), default=48,
                  help="tokens at most in the answer (default %(default)s)")


def parse(text: str) -> list[list[str]]:
    """The triples of the lines "subject | relation | object" (parts stripped; a line with an empty
    part is left out)."""
    triples = []
    for line in text.splitlines():
        parts = [part.strip() for part in line.split("|")]
        if len(parts) == 3 and all(parts):
            triples.append(parts)
    return triples


def facts_near(triples: list[list[str]], seeds: list[str], depth: int) -> list[str]:
    """Every triple on an edge a breadth-first walk from ``seeds`` crosses within ``depth`` hops, either
    way along it, as "subject relation object"; sorted, each once. Names match case-insensitively."""
    edges: dict[str, list[tuple[int, str]]] = {}
    for i, (subject, _, obj) in enumerate(triples):
        edges.setdefault(subject.casefold(), []).append((i, obj.casefold()))
        edges.setdefault(obj.casefold(), []).append((i, subject.casefold()))
    seen = {seed.casefold() for seed in seeds}
    frontier, found = list(seen), set()
    for _ in range(depth):
        reached = []
        for node in frontier:
            for i, other in edges.get(node, ()):
                found.add(i)
                if other not in seen:
                    seen.add(other)
                    reached.append(other)
        frontier = reached
    return sorted({" ".join(triples[i]) for i in found})


def seeds_of(triples: list[list[str]], question: str, given: list[str] | None) -> list[str]:
    if given:
        return given
    names = {}  # casefold -> the spelling first seen
    for subject, _, obj in triples:
        names.setdefault(subject.casefold(), subject)
        names.setdefault(obj.casefold(), obj)
    named = [name for key, name in names.items() if key in question.casefold()]
    return named or list(names.values())


async def main(args: list[str]) -> None:
    opt = ARGS.parse(args)
    pattern = f"(?:{NAME} \\| {RELATION} \\| {NAME}\n){{1,{opt.max_facts}}}"
    extract_prompt = EXTRACT.format(passage=opt.passage)
    grammar = inferlet.Grammar.regex(pattern)
    with inferlet.Context() as ctx:
        ctx.fill_chat([{"role": "user", "content": extract_prompt}])
        extracted = await ctx.generate(inferlet.Greedy(), inferlet.Stop(max_tokens=opt.max_facts * 32),
                                       inferlet.Shape(grammar=grammar))
    triples = parse(extracted)
    seeds = seeds_of(triples, opt.question, opt.entity)
    facts = facts_near(triples, seeds, opt.depth)
    ask_prompt = ASK.format(facts="\n".join(f"- {fact}" for fact in facts) or "(none)", question=opt.question)
    with inferlet.Context() as ctx:
        ctx.fill_chat([{"role": "user", "content": ask_prompt}])
        answer = await ctx.generate(inferlet.Greedy(), inferlet.Stop(max_tokens=opt.max_tokens))
        tokens = list(ctx.generated)
    print(answer)
    inferlet.send(json.dumps({"extraction": {"prompt": extract_prompt, "pattern": pattern, "text": extracted},
                              "triples": triples, "seeds": seeds, "facts": facts,
                              "answer": {"prompt": ask_prompt, "tokens": tokens, "text": answer}}))


WitWorld = inferlet.run(main)

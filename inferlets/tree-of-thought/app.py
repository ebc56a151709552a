"""tree-of-thought: breadth-first tree-of-thought search on an arithmetic puzzle, each step checked.

Combine the numbers two at a time with + - * until the one left equals TARGET. A state is the
numbers left, the expression each stands for, and a context. Each state gets W proposals, sampled
(top-k 20, seeded per proposal) in forks of its context, all of a level's proposals at once. The
inferlet checks each symbolically: a line "a op b = c" (else verdict "parse"), a and b among the
numbers left ("numbers"), a op b equal to c ("arithmetic"). A valid proposal's fork, already
holding the step, becomes a child state; children with the same numbers left merge, and the B
whose nearest number is closest to TARGET are expanded next. P bounds the proposals in all.
--hint forces the d-th step as the first proposal of every state at depth d (filled, not
sampled), checked like any other. Sends one JSON message: {"solution": expression or null,
"steps": [...], "counts": {verdict: n}, "proposals": [{"depth", "numbers", "text", "verdict"}]}.
"""

import json
import operator
import re

import inferlet
from inferlet.arguments import whole

OPS = {"+": operator.add, "-": operator.sub, "*": operator.mul}
STEP = re.compile(r"\s*(-?\d+)\s*([-+*])\s*(-?\d+)\s*=\s*(-?\d+)")
EXAMPLE = ("Combine two numbers per step with + - or * until one number is left: the target.\n"
           "Target 10. Numbers: 1 2 3 4\nStep: 1 + 2 = 3\nLeft: 3 3 4\nStep: 3 + 3 = 6\nLeft: 6 4\n"
           "Step: 6 + 4 = 10\nLeft: 10\n\n")


ARGS = inferlet.ArgumentParser("tree-of-thought", __doc__)
ARGS.add_argument("target", metavar="TARGET", type=int, help="the number to reach")
ARGS.add_argument("numbers", metavar="N", type=int, nargs="+", help="the numbers to combine, two or more")
ARGS.add_argument("--width", metavar="W", type=whole(1), default=3, help="proposals per state (default %(default)s)")
ARGS.add_argument("--beam", metavar="B", type=whole(1), default=2,
                  help="states expanded per level (default %(default)s)")
ARGS.add_argument("--budget", metavar="P", type=whole(1), default=24, help="proposals in all (default %(default)s)")
ARGS.add_argument("--seed", metavar="S", type=int, default=0, help="the proposals' seed (default %(default)s)")
ARGS.add_argument("--hint", metavar="STEPS", type=lambda steps: [h for h in steps.split(",") if h], default=[],
                  help='steps "a+b=c,c*d=e,...": the d-th is the first proposal of every state at depth d')


def check(items: list[tuple[int, str]], text: str) -> tuple[str, list | None, str]:
    """Verdict on a proposed step over ``items`` (number, expression); if valid, the items left and the step."""
    m = STEP.match(text)
    if not m:
        return "parse", None, ""
    a, op, b, c = int(m[1]), m[2], int(m[3]), int(m[4])
    left, operands = list(items), []
    for x in (a, b):
        at = next((i for i, (n, _) in enumerate(left) if n == x), None)
        if at is None:
            return "numbers", None, ""
        operands.append(left.pop(at)[1])
    if OPS[op](a, b) != c:
        return "arithmetic", None, ""
    return "ok", left + [(c, f"({operands[0]} {op} {operands[1]})")], f"{a} {op} {b} = {c}"


async def propose(parent, hint: str | None, seed: int):
    """A fork of ``parent`` holding one proposed step (the hint, or sampled), and the step's text."""
    ctx = await parent.fork()
    ctx.fill("Step:")  # in the fork: forwarding these gives the distribution of the step's first token
    if hint is not None:
        ctx.fill(f" {hint}\n")
        return ctx, hint
    text = await ctx.generate(inferlet.TopK(20, seed=seed), inferlet.Stop(max_tokens=12, strings=("\n",)))
    if "\n" not in inferlet.decode(ctx.generated):
        ctx.fill("\n")
    return ctx, text.strip()


async def main(args: list[str]) -> None:
    opt = ARGS.parse(args)
    if len(opt.numbers) < 2:
        ARGS.error("give two or more numbers N after TARGET")
    target, numbers = opt.target, opt.numbers
    root = inferlet.Context()
    root.fill(f"{EXAMPLE}Target {target}. Numbers: {' '.join(map(str, numbers))}\n")
    frontier = [(root, [(n, str(n)) for n in numbers], [])]  # (context, items, steps) per state
    proposals, solution = [], None
    for depth in range(len(numbers) - 1):
        if not frontier:
            break
        # The forks share this prefix but its last token, which each feeds with its "Step:".
        await inferlet.gather(*(ctx.flush() for ctx, _, _ in frontier))
        jobs = []  # (state, hint or None), in proposal order
        for state in frontier:
            for j in range(min(opt.width, opt.budget - len(proposals) - len(jobs))):
                jobs.append((state, opt.hint[depth] if j == 0 and depth < len(opt.hint) else None))
        seed0 = opt.seed * 1_000_003 + len(proposals)
        forks = await inferlet.gather(*(propose(s[0], h, seed0 + i) for i, (s, h) in enumerate(jobs)))
        children = {}
        for ((_, items, steps), _), (fork, text) in zip(jobs, forks):
            verdict, left, step = check(items, text)
            proposals.append({"depth": depth, "numbers": [n for n, _ in items], "text": text, "verdict": verdict})
            key = tuple(sorted(n for n, _ in left)) if left else None
            if key == (target,) and solution is None:
                solution = {"solution": left[0][1][1:-1], "steps": steps + [step]}
            if verdict != "ok" or len(left) == 1 or key in children:
                fork.close()
            else:
                children[key] = (fork, left, steps + [step])
        for ctx, _, _ in frontier:
            ctx.close()
        ranked = sorted(children.values(), key=lambda s: min(abs(n - target) for n, _ in s[1]))
        frontier = [] if solution else ranked[:opt.beam]
        for ctx, _, _ in ranked[len(frontier):]:
            ctx.close()
        for ctx, items, _ in frontier:
            ctx.fill(f"Left: {' '.join(str(n) for n, _ in items)}\n")
    counts = {v: sum(p["verdict"] == v for p in proposals) for v in ("ok", "parse", "numbers", "arithmetic")}
    inferlet.send(json.dumps({**(solution or {"solution": None, "steps": []}), "counts": counts, "proposals": proposals}))


WitWorld = inferlet.run(main)

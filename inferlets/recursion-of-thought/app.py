"""recursion-of-thought: split a problem into subproblems, solve each in a context of its own
(recursively, depth-capped), and substitute their answers back.

Recursion of Thought (Lee & Kim 2023). The root context holds the instructions and a worked example,
forwarded once. A problem is one user turn after it: the model either answers ("Answer: VALUE") or
writes subproblems, one line each, "Sub: SUBPROBLEM" (the first S lines so marked count). Each
subproblem is solved the same way in its own fork of the root context, all siblings at once, so
their forwards batch together; their answers come back to the parent as a user turn, "Results: A1;
A2", and the parent, cued with "Answer:", composes its answer. At depth D (the root is depth 0) the
reply is cued with "Answer:" from the start: no splitting there, so the recursion ends.

--sequential is the reference: every problem in a fresh context (the root's tokens forwarded anew,
no fork), the subproblems one after another. It gives every node the tokens the forks give
(tests/test_recursion_of_thought.py checks this).

Greedy throughout, M tokens a reply. Sends one JSON message: {"mode", "answer", "root": the root's ids,
"tree": node, "nodes": how many}, a node being {"problem", "depth", "forced": cued to answer at once,
"prompt": the ids after the root before its reply, "reply": ids, "subs": [nodes], "fed": the ids
after the reply (the results turn and "Answer:"), "compose": the ids the model then wrote (both
null for a leaf), "answer"}.
"""

import json
import re

import inferlet
from inferlet.arguments import text, whole

MAX_DEPTH, MAX_SUBS = 3, 3  # at most 1 + 3 + 9 + 27 = 40 problems
SYSTEM = ("Solve the problem. If it is simple, reply with Answer: and the value. Otherwise split it into "
          "simpler subproblems, one per line, each as Sub: and the subproblem. You will be given their "
          "results; then reply with Answer: and the value.")
EXAMPLE = [{"role": "user", "content": "Problem: (12 + 5) * (6 - 2)"},
           {"role": "assistant", "content": "Sub: 12 + 5\nSub: 6 - 2"},
           {"role": "user", "content": "Results: 17; 4"},
           {"role": "assistant", "content": "Answer: 17 * 4 = 68"},
           {"role": "user", "content": "Problem: 9 + 3"},
           {"role": "assistant", "content": "Answer: 12"}]
SUB = re.compile(r"\s*Sub:\s*(\S.*?)\s*$")
ANSWER = "Answer:"
MARK = "\x1fREPLY\x1f"  # stands for a reply in a rendered chat, to find the text that follows one


ARGS = inferlet.ArgumentParser("recursion-of-thought", __doc__)
ARGS.add_argument("problem", metavar="PROBLEM", type=text, help="the problem")
ARGS.add_argument("--depth", metavar="D", type=whole(0, MAX_DEPTH), default=2,
                  help="the depth at which a problem is answered without splitting (default %(default)s)")
ARGS.add_argument("--subs", metavar="S", type=whole(1, MAX_SUBS), default=3,
                  help="subproblems at most per problem (default %(default)s)")
ARGS.add_argument("--max-tokens", metavar="M", type=whole(1), default=24,
                  help="tokens at most per reply (default %(default)s)")
ARGS.add_argument("--sequential", action="store_true",
                  help="the reference: every problem in a fresh context, the subproblems one after another")


class Solver:
    def __init__(self, root: inferlet.Context, root_ids: list[int], root_text: str, opt):
        self.root, self.root_ids, self.root_text, self.opt = root, root_ids, root_text, opt
        self.nodes = 0

    def turn(self, messages: list[dict]) -> str:
        """``messages`` and the cue of the next reply, as the chat template writes them after the root."""
        whole = inferlet.render_chat([{"role": "system", "content": SYSTEM}, *EXAMPLE, *messages])
        if not whole.startswith(self.root_text):
            raise ValueError("the chat template does not keep earlier turns as they are")
        return whole[len(self.root_text):]

    async def context(self) -> inferlet.Context:
        if self.opt.sequential:  # fresh: the root's tokens forwarded again
            ctx = inferlet.Context()
            ctx.fill_tokens(self.root_ids)
            return ctx
        return await self.root.fork()

    async def reply(self, ctx: inferlet.Context) -> tuple[list[int], str]:
        text = await ctx.generate(inferlet.Greedy(), inferlet.Stop(max_tokens=self.opt.max_tokens))
        return list(ctx.generated), text

    async def solve(self, problem: str, depth: int) -> dict:
        self.nodes += 1
        forced = depth >= self.opt.depth
        user = {"role": "user", "content": f"Problem: {problem}"}
        node = {"problem": problem, "depth": depth, "forced": forced, "prompt": inferlet.encode(self.turn([user])),
                "subs": [], "fed": None, "compose": None}
        if forced:
            node["prompt"] += inferlet.encode(ANSWER)
        with await self.context() as ctx:
            ctx.fill_tokens(node["prompt"])
            node["reply"], text = await self.reply(ctx)
            subs = [] if forced else [m[1] for m in map(SUB.match, text.split(ANSWER)[0].splitlines()) if m]
            subs = subs[:self.opt.subs]
            if not subs:
                node["answer"] = answer_of(text if forced else text.split(ANSWER, 1)[-1])
                return node
            solving = [self.solve(sub, depth + 1) for sub in subs]
            if self.opt.sequential:
                node["subs"] = [await s for s in solving]
            else:
                node["subs"] = await inferlet.gather(*solving)
            results = "; ".join(s["answer"] for s in node["subs"])
            # the reply as the model wrote it, then the answers substituted back, then the cue to compose
            after = self.turn([user, {"role": "assistant", "content": MARK},
                               {"role": "user", "content": f"Results: {results}"}])
            after = after[after.index(MARK) + len(MARK):]
            end = inferlet.decode(node["reply"][-1:])
            ended = node["reply"][-1] in inferlet.stop_tokens()
            node["fed"] = inferlet.encode(after[len(end):] if ended and after.startswith(end) else after)
            node["fed"] += inferlet.encode(ANSWER)
            ctx.fill_tokens(node["fed"])
            node["compose"], text = await self.reply(ctx)
            node["answer"] = answer_of(text)
        return node


def answer_of(text: str) -> str:
    """The first line of ``text``, stripped ("?" if there is none: a result line must hold something)."""
    return text.strip().split("\n", 1)[0].strip() or "?"


async def main(args: list[str]) -> None:
    opt = ARGS.parse(args)
    root_text = inferlet.render_chat([{"role": "system", "content": SYSTEM}, *EXAMPLE], add_generation_prompt=False)
    root_ids = inferlet.encode(root_text)
    with inferlet.Context() as root:
        root.fill_tokens(root_ids)
        await root.flush()  # all but the last token: each fork feeds that one with its problem
        solver = Solver(root, root_ids, root_text, opt)
        tree = await solver.solve(opt.problem, 0)
    inferlet.send(json.dumps({"mode": "sequential" if opt.sequential else "parallel", "answer": tree["answer"],
                              "root": root_ids, "tree": tree, "nodes": solver.nodes}))


WitWorld = inferlet.run(main)

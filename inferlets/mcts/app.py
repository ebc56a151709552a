"""mcts: Monte Carlo tree search over continuations, each node a fork of its parent's context.

The root is the prompt. A node is a chunk of at most C tokens after its parent's: its first token is
one of the parent's B most probable next tokens, the rest greedy (an end token ends the chunk). Its
context is a fork of the parent's (the pages before the chunk shared, copy on write), kept while the
search runs so that its own children fork it. Its value is the mean log-probability of its chunk's
tokens under the model. A node is terminal at depth D (the root is depth 0) or after an end token.

Each of the S simulations walks down from the root. At a node not yet expanded, one forward of its
context gives its top-B distribution: the B children-to-be. If the node has children not yet visited,
one of them is picked by a SplitMix64 generator seeded N (the sdk's ``Rng``: index = next_u64 mod
their count, in index order) and evaluated: the walk stops there. Otherwise the walk goes to the
child of highest UCT, sum/visits + X * sqrt(ln(parent's visits) / visits), the lower index on a
tie, until a terminal node, whose value is used again. The value is then added to every node on the
path, and each one's visit count goes up by one. After the S simulations the choice follows the most
visited child from the root (the higher mean value, then the lower index, on a tie) while there is
a visited one. Same arguments, same tree: nothing here is random but the seeded order.

Sends one JSON message: {"prompt": [ids], "nodes": [{"parent", "index": which of the parent's top
tokens, "depth", "tokens", "logprobs", "value", "terminal", "top": {"token_ids", "probs"} once expanded
else null, "children": [node id or null, one per top token], "visits", "value_sum"}, node 0 the root],
"simulations": [[node ids from the root]], "choice": [node ids], "tokens": [the chosen chunks' ids],
"text"}.
"""

import json
import math

import inferlet
from inferlet.arguments import number, text, whole

MAX_SIMULATIONS = 256  # every simulation but those ending on a terminal node holds one more context

ARGS = inferlet.ArgumentParser("mcts", __doc__)
ARGS.add_argument("prompt", metavar="PROMPT", type=text, help="the root")
ARGS.add_argument("--simulations", metavar="S", type=whole(1, MAX_SIMULATIONS), default=8,
                  help="simulations (default %(default)s)")
ARGS.add_argument("--branch", metavar="B", type=whole(1), default=3, help="children per node (default %(default)s)")
ARGS.add_argument("--chunk", metavar="C", type=whole(1), default=4,
                  help="tokens per node at most (default %(default)s)")
ARGS.add_argument("--depth", metavar="D", type=whole(1), default=3,
                  help="the depth of a terminal node (default %(default)s)")
ARGS.add_argument("--explore", metavar="X", type=number(0), default=1.0,
                  help="UCT's exploration weight (default %(default)s)")
ARGS.add_argument("--seed", metavar="N", type=whole(0), default=0,
                  help="the seed of the order unvisited children are tried in (default %(default)s)")


class Node:
    __slots__ = ("parent", "index", "depth", "ctx", "tokens", "logprobs", "terminal", "top", "children",
                 "visits", "value_sum")

    def __init__(self, parent: int | None, index: int, depth: int, ctx: inferlet.Context, tokens: list[int],
                 logprobs: list[float], terminal: bool):
        self.parent, self.index, self.depth, self.ctx = parent, index, depth, ctx
        self.tokens, self.logprobs, self.terminal = tokens, logprobs, terminal
        self.top, self.children, self.visits, self.value_sum = None, [], 0, 0.0

    @property
    def value(self) -> float:
        return sum(self.logprobs) / len(self.logprobs) if self.logprobs else 0.0

    def report(self) -> dict:
        top = None if self.top is None else {"token_ids": self.top.token_ids, "probs": self.top.probs}
        return {"parent": self.parent, "index": self.index, "depth": self.depth, "tokens": self.tokens,
                "logprobs": self.logprobs, "value": self.value, "terminal": self.terminal, "top": top,
                "children": self.children, "visits": self.visits, "value_sum": self.value_sum}


class Search:
    def __init__(self, root: inferlet.Context, opt):
        self.nodes = [Node(None, 0, 0, root, [], [], False)]
        self.opt, self.rng, self.stops = opt, inferlet.Rng(opt.seed), inferlet.stop_tokens()

    async def expand(self, node: Node) -> None:
        node.top = await node.ctx.next_dist(self.opt.branch)
        node.children = [None] * len(node.top.token_ids)

    async def evaluate(self, parent_id: int, index: int) -> int:
        """Make the parent's child ``index``: fork, its first token, the greedy rest of its chunk."""
        parent = self.nodes[parent_id]
        token, ctx = parent.top.token_ids[index], await parent.ctx.fork()
        tokens, logprobs = [token], [math.log(parent.top.probs[index])]
        ctx.fill_tokens(tokens)
        if token not in self.stops and self.opt.chunk > 1:
            await ctx.generate(inferlet.Greedy(), inferlet.Stop(max_tokens=self.opt.chunk - 1),
                               inferlet.Shape(logprobs=0))
            tokens += ctx.generated
            logprobs += [lp.logprob for lp in ctx.logprobs]
        depth = parent.depth + 1
        terminal = tokens[-1] in self.stops or depth == self.opt.depth
        if terminal:  # never forked: its pages can go now
            ctx.close()
        self.nodes.append(Node(parent_id, index, depth, ctx, tokens, logprobs, terminal))
        parent.children[index] = len(self.nodes) - 1
        return len(self.nodes) - 1

    def uct(self, parent: Node, child: Node) -> float:
        explore = self.opt.explore * math.sqrt(math.log(parent.visits) / child.visits)
        return child.value_sum / child.visits + explore

    async def simulate(self) -> list[int]:
        path = [0]
        while not self.nodes[path[-1]].terminal:
            node = self.nodes[path[-1]]
            if node.top is None:
                await self.expand(node)
            unvisited = [i for i, c in enumerate(node.children) if c is None]
            if unvisited:
                path.append(await self.evaluate(path[-1], unvisited[self.rng.next_u64() % len(unvisited)]))
                break
            children = [self.nodes[c] for c in node.children]
            path.append(node.children[max(range(len(children)), key=lambda i: self.uct(node, children[i]))])
        value = self.nodes[path[-1]].value
        for n in path:
            self.nodes[n].visits += 1
            self.nodes[n].value_sum += value
        return path

    def choice(self) -> list[int]:
        path = [0]
        while True:
            visited = [c for c in self.nodes[path[-1]].children if c is not None and self.nodes[c].visits > 0]
            if not visited:
                return path[1:]
            path.append(max(visited, key=lambda c: (self.nodes[c].visits, self.nodes[c].value, -c)))


async def main(args: list[str]) -> None:
    opt = ARGS.parse(args)
    prompt = inferlet.encode(opt.prompt)
    root = inferlet.Context()
    root.fill_tokens(prompt)
    search = Search(root, opt)
    try:
        simulations = [await search.simulate() for _ in range(opt.simulations)]
    finally:
        for node in search.nodes:
            node.ctx.close()
    choice = search.choice()
    tokens = [t for n in choice for t in search.nodes[n].tokens]
    inferlet.send(json.dumps({"prompt": prompt, "nodes": [n.report() for n in search.nodes],
                              "simulations": simulations, "choice": choice, "tokens": tokens,
                              "text": inferlet.decode(tokens)}))


WitWorld = inferlet.run(main)

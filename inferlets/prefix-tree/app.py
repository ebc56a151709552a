"""prefix-tree: greedy generation at every leaf of a tree of prompts, each shared prefix forwarded once.

TREE is JSON: a node is {"text": "...", "children": [node, ...]} ("children" may be left out: a
leaf). A leaf's prompt is the texts on its path from the root, each tokenized on its own and
concatenated; say a system prompt, then several questions, each with a couple of follow-ups.

The root's tokens are forwarded once (``next_dist`` forwards every pending token, so nothing is
left pending); each child forks its parent (full pages shared copy-on-write, the partial last page
copied), fills its own text and, if it has children, forwards it once in turn. Every leaf then
decodes greedily on its own fork, all leaves at once, so their decode steps batch together. Each
token of the tree is thus forwarded once before decoding starts, against once per leaf under it
when every leaf's prompt is forwarded alone; a leaf's tokens equal greedy decoding of its prompt
alone. ``--independent`` does the latter (one fresh context per leaf, the same concurrency): the
baseline the savings are measured against.

Sends one JSON message: {"leaves": [{"path": [child indices from the root], "tokens": [...],
"text": ...}, ...] (depth-first, in the tree's order), "prefill_tokens": the prompt tokens
forwarded, "independent_prefill_tokens": the sum of the leaves' prompt lengths}.
"""

import json

import inferlet
from inferlet.arguments import whole

ARGS = inferlet.ArgumentParser("prefix-tree", __doc__)
ARGS.add_argument("tree", metavar="TREE", help="the tree of prompts, as JSON")
ARGS.add_argument("max_new", metavar="MAX_NEW_TOKENS", nargs="?", type=whole(1), default=16,
                  help="tokens at most per leaf (default %(default)s)")
ARGS.add_argument("--independent", action="store_true", help="the baseline: every leaf's whole prompt forwarded alone")


class Node:
    def __init__(self, tokens: list[int], children: list["Node"]):
        self.tokens, self.children = tokens, children


def parse_node(value, where: str) -> Node:
    """A node of the tree with its text tokenized; ValueError naming the bad part (``where``)."""
    if not isinstance(value, dict):
        raise ValueError(f"{where}: expected an object with \"text\" and \"children\"")
    unknown = sorted(set(value) - {"text", "children"})
    if unknown:
        raise ValueError(f"{where}: unknown key {unknown[0]!r} (a node has \"text\" and \"children\")")
    text, children = value.get("text"), value.get("children", [])
    if not isinstance(text, str) or not text:
        raise ValueError(f"{where}.text: expected a non-empty string")
    if not isinstance(children, list):
        raise ValueError(f"{where}.children: expected a list of nodes")
    return Node(inferlet.encode(text), [parse_node(c, f"{where}.children[{i}]") for i, c in enumerate(children)])


def parse_tree(text: str) -> Node:
    try:
        return parse_node(json.loads(text), "tree")
    except json.JSONDecodeError as err:
        ARGS.error(f"TREE is not JSON: {err}")
    except ValueError as err:
        ARGS.error(str(err))


def leaves(node: Node, path: list[int], prompt: list[int]) -> list[tuple[list[int], list[int]]]:
    """(path, full prompt) of every leaf under ``node``, depth-first."""
    prompt = prompt + node.tokens
    if not node.children:
        return [(path, prompt)]
    return [leaf for i, child in enumerate(node.children) for leaf in leaves(child, path + [i], prompt)]


class Tree:
    """Generation over the tree: results by leaf path, and the prompt tokens forwarded."""

    def __init__(self, max_new: int):
        self.stop = inferlet.Stop(max_tokens=max_new)
        self.results: dict[tuple, dict] = {}
        self.prefill_tokens = 0

    async def leaf(self, ctx: inferlet.Context, path: list[int]) -> None:
        """Decode at a leaf whose prompt ends in ``ctx``'s pending tokens (the first step forwards them)."""
        self.prefill_tokens += len(ctx.pending)
        text = await ctx.generate(inferlet.Greedy(), self.stop)
        self.results[tuple(path)] = {"path": path, "tokens": ctx.generated, "text": text}

    async def grow(self, node: Node, ctx: inferlet.Context, path: list[int]) -> None:
        """Generate under ``node``, whose tokens are pending in ``ctx`` behind its ancestors' forwarded ones."""
        if not node.children:
            await self.leaf(ctx, path)
            return
        self.prefill_tokens += len(ctx.pending)
        await ctx.next_dist(1)  # forward the node's tokens once, for every leaf below it
        await inferlet.gather(*(self.branch(ctx, child, path + [i]) for i, child in enumerate(node.children)))

    async def branch(self, parent: inferlet.Context, node: Node, path: list[int]) -> None:
        with await parent.fork() as ctx:
            ctx.fill_tokens(node.tokens)
            await self.grow(node, ctx, path)

    async def alone(self, path: list[int], prompt: list[int]) -> None:
        """The baseline: a leaf's whole prompt on a fresh context."""
        with inferlet.Context() as ctx:
            ctx.fill_tokens(prompt)
            await self.leaf(ctx, path)


async def main(args: list[str]) -> None:
    opt = ARGS.parse(args)
    root = parse_tree(opt.tree)
    all_leaves = leaves(root, [], [])
    tree = Tree(opt.max_new)
    if opt.independent:
        await inferlet.gather(*(tree.alone(path, prompt) for path, prompt in all_leaves))
    else:
        with inferlet.Context() as ctx:
            ctx.fill_tokens(root.tokens)
            await tree.grow(root, ctx, [])
    inferlet.send(json.dumps({"leaves": [tree.results[tuple(path)] for path, _ in all_leaves],
                              "prefill_tokens": tree.prefill_tokens,
                              "independent_prefill_tokens": sum(len(prompt) for _, prompt in all_leaves)}))


WitWorld = inferlet.run(main)

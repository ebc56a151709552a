"""self-consistency: N sampled reasoning paths, an answer extracted from each, the majority answer.

Self-consistency (Wang et al. 2023). The prompt (raw text, or one user turn with --chat) is forwarded
once; N forks of it each sample a path of at most M tokens (the K most probable tokens at temperature
T, path i seeded S + i: the server draws them, and path i is what that seeded sampler writes from the
prompt alone). Each path's answer is REGEX's last match in its text (group 1 if REGEX has a group;
default: the last number); a path without a match does not vote. The majority answer has the most
votes; on a tie, the tied answer that some path gave first (lowest path index) wins.

Beside the vote, the consensus path (Pie's consensus decoding): each path's answer (its stripped text if
it has none; the first 64 characters of either) is compared with every other path's by normalized
edit-distance similarity, 1 - levenshtein(a, b) / max(len(a), len(b)) (1 for two empty strings); the
path with the highest mean similarity to the others is the most central (ties: the lowest index). Unlike
the vote it needs no exact agreement: answers that differ a little still count for each other.

Sends one JSON message: {"answer": the majority answer or null if no path has one, "votes": its votes,
"counts": [[answer, votes], ...] most votes first, ties in the same order, "central": {"index": the
consensus path, "centrality": [each path's mean similarity]}, "paths": [{"index", "tokens", "text",
"answer"}]}.
"""

import json
import re

import inferlet
from inferlet.arguments import number, regex, text, whole

DEFAULT_PATTERN = r"-?\d+(?:\.\d+)?"
MAX_PATTERN_CHARS = 256  # a client's regex runs here, once per path: keep it a pattern, not a program
COMPARED_CHARS = 64  # N paths cost N^2/2 * this^2 steps: at 64 paths 8 million, about 5 s in the sandbox


ARGS = inferlet.ArgumentParser("self-consistency", __doc__)
ARGS.add_argument("prompt", metavar="PROMPT", type=text, help="the prompt the paths share")
ARGS.add_argument("--n", metavar="N", type=whole(1, 64), default=5, help="paths (default %(default)s)")
ARGS.add_argument("--max-tokens", metavar="M", type=whole(1), default=32,
                  help="tokens at most per path (default %(default)s)")
ARGS.add_argument("--temperature", metavar="T", type=number(0), default=0.7,
                  help="the sampling temperature (default %(default)s)")
ARGS.add_argument("--top-k", metavar="K", type=whole(1), default=40,
                  help="sample among the K most probable tokens (default %(default)s)")
ARGS.add_argument("--seed", metavar="S", type=whole(0), default=0, help="path i's seed is S + i (default %(default)s)")
ARGS.add_argument("--pattern", metavar="REGEX", type=regex(MAX_PATTERN_CHARS), default=DEFAULT_PATTERN,
                  help="a path's answer is its last match, group 1 if it has one (default: the last number)")
ARGS.add_argument("--chat", action="store_true", help="PROMPT is a user turn of the chat template")


def extract(pattern: re.Pattern, text: str) -> str | None:
    """The last match of ``pattern`` in ``text`` (its group 1 if it has groups), or None."""
    last = None
    for last in pattern.finditer(text):
        pass
    if last is None:
        return None
    return last.group(1) if pattern.groups else last.group(0)


def tally(answers: list[str | None]) -> list[list]:
    """[[answer, votes], ...]: most votes first; equal votes in the order the answers first appear."""
    counts: dict[str, int] = {}
    for answer in answers:
        if answer is not None:
            counts[answer] = counts.get(answer, 0) + 1  # a dict keeps first-appearance order
    return sorted(([a, n] for a, n in counts.items()), key=lambda c: -c[1])  # a stable sort keeps it on ties


def levenshtein(a: str, b: str) -> int:
    """The fewest single-character insertions, deletions and substitutions that turn ``a`` into ``b``."""
    row = list(range(len(b) + 1))
    for i, x in enumerate(a, 1):
        diagonal, row[0] = row[0], i
        for j, y in enumerate(b, 1):
            diagonal, row[j] = row[j], min(row[j] + 1, row[j - 1] + 1, diagonal + (x != y))
    return row[-1]


def similarity(a: str, b: str) -> float:
    longest = max(len(a), len(b))
    return 1.0 - levenshtein(a, b) / longest if longest else 1.0


async def centrality(keys: list[str]) -> list[float]:
    """Each key's mean similarity to the other keys (1.0 for a lone key)."""
    n = len(keys)
    sim = [[0.0] * n for _ in range(n)]
    for i in range(n):
        for j in range(i + 1, n):
            sim[i][j] = sim[j][i] = similarity(keys[i], keys[j])
        await inferlet.sleep(0)  # a row per slice: none runs past its deadline (oven serve --slice-ms)
    return [sum(sim[i][j] for j in range(n) if j != i) / (n - 1) if n > 1 else 1.0 for i in range(n)]


async def path(prompt: inferlet.Context, index: int, opt) -> dict:
    sampler = inferlet.TopK(opt.top_k, temperature=opt.temperature, seed=opt.seed + index)
    with await prompt.fork() as ctx:
        text = await ctx.generate(sampler, inferlet.Stop(max_tokens=opt.max_tokens))
        return {"index": index, "tokens": list(ctx.generated), "text": text,
                "answer": extract(opt.pattern, text)}


async def main(args: list[str]) -> None:
    opt = ARGS.parse(args)
    with inferlet.Context() as prompt:
        if opt.chat:
            prompt.fill_chat([{"role": "user", "content": opt.prompt}])
        else:
            prompt.fill(opt.prompt)
        await prompt.flush()  # all but the last token, once: each fork feeds that one itself
        paths = await inferlet.gather(*(path(prompt, i, opt) for i in range(opt.n)))
    counts = tally([p["answer"] for p in paths])
    answer, votes = counts[0] if counts else (None, 0)
    keys = [(p["answer"] if p["answer"] is not None else p["text"].strip())[:COMPARED_CHARS] for p in paths]
    scores = await centrality(keys)
    central = {"index": scores.index(max(scores)), "centrality": scores}  # index(): the lowest on a tie
    inferlet.send(json.dumps({"answer": answer, "votes": votes, "counts": counts, "central": central,
                              "paths": paths}))


WitWorld = inferlet.run(main)

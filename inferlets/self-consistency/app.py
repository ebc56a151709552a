"""self-consistency: N sampled reasoning paths, an answer extracted from each, the majority answer.

Arguments: PROMPT [--n N=5] [--max-tokens M=32] [--temperature T=0.7] [--top-k K=40] [--seed S=0]
           [--pattern REGEX] [--chat]

Self-consistency (Wang et al. 2023). The prompt (raw text, or one user turn with --chat) is forwarded
once; N forks of it each sample a path of at most M tokens (the K most probable tokens at temperature
T, path i seeded S + i: the server draws them, and path i is what that seeded sampler writes from the
prompt alone). Each path's answer is REGEX's last match in its text (group 1 if REGEX has a group;
default: the last number); a path without a match does not vote. The majority answer has the most
votes; on a tie, the tied answer that some path gave first (lowest path index) wins. Sends one JSON
message: {"answer": the majority answer or null if no path has one, "votes": its votes, "counts":
[[answer, votes], ...] most votes first, ties in the same order, "paths": [{"index", "tokens",
"text", "answer"}]}.
"""

import json
import re

import inferlet

USAGE = ("usage: self-consistency PROMPT [--n N] [--max-tokens M] [--temperature T] [--top-k K] [--seed S] "
         "[--pattern REGEX] [--chat]")
DEFAULT_PATTERN = r"-?\d+(?:\.\d+)?"
MAX_PATTERN_CHARS = 256  # a client's regex runs here, once per path: keep it a pattern, not a program
INT_OPTIONS = ("--n", "--max-tokens", "--top-k", "--seed")


def parse(args: list[str]) -> tuple[str, dict]:
    opt = {"--n": 5, "--max-tokens": 32, "--temperature": 0.7, "--top-k": 40, "--seed": 0,
           "--pattern": DEFAULT_PATTERN, "--chat": False}
    positional, it = [], iter(args)
    try:
        for arg in it:
            if arg == "--chat":
                opt[arg] = True
            elif arg in INT_OPTIONS:
                opt[arg] = int(next(it))
            elif arg == "--temperature":
                opt[arg] = float(next(it))
            elif arg == "--pattern":
                opt[arg] = next(it)
            elif arg.startswith("--"):
                raise ValueError(f"unknown option {arg}")
            else:
                positional.append(arg)
        if len(opt["--pattern"]) > MAX_PATTERN_CHARS:
            raise ValueError(f"REGEX is longer than {MAX_PATTERN_CHARS} characters")
        opt["--pattern"] = re.compile(opt["--pattern"])
    except (StopIteration, ValueError, re.error) as exc:
        raise ValueError(f"{str(exc) or 'an option needs a value'}; {USAGE}") from None
    if len(positional) != 1 or not positional[0]:
        raise ValueError(f"give one non-empty PROMPT; {USAGE}")
    if not (1 <= opt["--n"] <= 64 and opt["--max-tokens"] >= 1 and opt["--top-k"] >= 1 and opt["--seed"] >= 0):
        raise ValueError(f"N must be in [1, 64], M and K >= 1, S >= 0; {USAGE}")
    if not opt["--temperature"] >= 0:
        raise ValueError(f"T must be >= 0; {USAGE}")
    return positional[0], opt


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


async def path(prompt: inferlet.Context, index: int, opt: dict) -> dict:
    sampler = inferlet.TopK(opt["--top-k"], temperature=opt["--temperature"], seed=opt["--seed"] + index)
    with await prompt.fork() as ctx:
        text = await ctx.generate(sampler, inferlet.Stop(max_tokens=opt["--max-tokens"]))
        return {"index": index, "tokens": list(ctx.generated), "text": text,
                "answer": extract(opt["--pattern"], text)}


async def main(args: list[str]) -> None:
    prompt_text, opt = parse(args)
    with inferlet.Context() as prompt:
        if opt["--chat"]:
            prompt.fill_chat([{"role": "user", "content": prompt_text}])
        else:
            prompt.fill(prompt_text)
        await prompt.flush()  # all but the last token, once: each fork feeds that one itself
        paths = await inferlet.gather(*(path(prompt, i, opt) for i in range(opt["--n"])))
    counts = tally([p["answer"] for p in paths])
    answer, votes = counts[0] if counts else (None, 0)
    inferlet.send(json.dumps({"answer": answer, "votes": votes, "counts": counts, "paths": paths}))


WitWorld = inferlet.run(main)

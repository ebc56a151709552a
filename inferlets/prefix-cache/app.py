"""prefix-cache: a shared prefix (a system prompt, say) forwarded once for every instance.

An instance that finds no export of the prefix flushes it (forwards every token but the last)
and exports those tokens' KV pages as "prefix-cache/" + sha256 of the prefix's token ids. One
that finds the export imports the pages and forwards only the prefix's last token and SUFFIX:
the partial last page is copied before they are written into it (the SDK's copy-on-write), so
the export stays intact. The export outlives the instance that made it until it is released
(``oven`` keeps exports until released). Two first instances racing on a prefix both forward
it; the later export is refused, which is fine. Greedy decoding of tokenize(PREFIX) +
tokenize(SUFFIX). Sends one JSON message:
{"tokens": [ids], "forwarded": tokens run through the model, "imported": bool}.

``--snapshot`` uses named snapshots instead of an export: the instance asks the server's prefix
index for the longest prefix of PREFIX + SUFFIX that one of its client's snapshots holds
(``Context.from_prefix``) and reuses those pages; one that finds none flushes PREFIX and saves it
as snapshot "prefix-cache/snapshot/" + the same hash. Its message adds "reused": the tokens taken
from a snapshot.
"""

import hashlib
import json

import inferlet
from inferlet.arguments import whole

ARGS = inferlet.ArgumentParser("prefix-cache", __doc__)
ARGS.add_argument("prefix", metavar="PREFIX", help="the shared prefix")
ARGS.add_argument("suffix", metavar="SUFFIX", help="this instance's text after it")
ARGS.add_argument("max_new", metavar="MAX_NEW_TOKENS", nargs="?", type=whole(1), default=16,
                  help="tokens at most (default %(default)s)")
MODE = ARGS.add_mutually_exclusive_group()
MODE.add_argument("--no-cache", dest="cache", action="store_false", help="neither import nor export the prefix")
MODE.add_argument("--snapshot", action="store_true", help="reuse a named snapshot found by prefix instead of an export")


def digest(prefix: list[int]) -> str:
    return hashlib.sha256(",".join(map(str, prefix)).encode()).hexdigest()


async def snapshot_context(prefix: list[int], suffix: list[int]) -> tuple[inferlet.Context, int]:
    """A context holding ``prefix`` + ``suffix``, the longest prefix a snapshot holds reused; how many
    tokens that is (0: none matched, and PREFIX but its last token is saved as a snapshot)."""
    ctx = inferlet.Context.from_prefix(prefix + suffix)
    if ctx.tokens:
        return ctx, len(ctx.tokens)
    ctx.close()
    ctx = inferlet.Context()
    ctx.fill_tokens(prefix)
    await ctx.flush()
    try:
        await ctx.snapshot("prefix-cache/snapshot/" + digest(prefix))
    except inferlet.OvenError:  # another instance saved it meanwhile
        pass
    ctx.fill_tokens(suffix)
    return ctx, 0


async def prefix_context(prefix: list[int], cache: bool) -> tuple[inferlet.Context, bool]:
    """A context holding ``prefix`` as a flush leaves it (the last token pending, the others
    forwarded); whether their pages were imported."""
    name = "prefix-cache/" + digest(prefix)
    if cache:
        try:
            ctx = inferlet.Context.imported(name, prefix[:-1])
        except inferlet.OvenError:  # no such export yet
            pass
        else:
            ctx.fill_tokens(prefix[-1:])
            return ctx, True
    ctx = inferlet.Context()
    ctx.fill_tokens(prefix)
    await ctx.flush()
    if cache:
        try:
            await ctx.export(name)
        except inferlet.OvenError:  # another instance exported it meanwhile
            pass
    return ctx, False


async def main(args: list[str]) -> None:
    opt = ARGS.parse(args)
    prefix, suffix = inferlet.encode(opt.prefix), inferlet.encode(opt.suffix)
    if not prefix or not suffix:
        ARGS.error("PREFIX and SUFFIX must both be non-empty")
    report = {}
    if opt.snapshot:
        ctx, reused = await snapshot_context(prefix, suffix)
        report["reused"] = reused
    else:
        ctx, imported = await prefix_context(prefix, opt.cache)
        ctx.fill_tokens(suffix)
        reused = len(prefix) - 1 if imported else 0
    with ctx:
        await ctx.generate(inferlet.Greedy(), inferlet.Stop(max_tokens=opt.max_new))
        report.update(tokens=ctx.generated, forwarded=len(ctx.tokens) - reused, imported=reused > 0)
        inferlet.send(json.dumps(report))


WitWorld = inferlet.run(main)

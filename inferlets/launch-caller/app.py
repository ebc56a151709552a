"""launch-caller: launches inferlets and awaits them (Pie's launch-caller), on the Python SDK.

Launches N children of program P, child i with arguments ["PROMPT i", K] (and --hold, passed on),
cancels child I at once if asked, awaits every child in order and sends, for each, one JSON message
{"child", "state", "code", "error", "messages"}; then one message with all their messages joined by
newlines. A launch the server refuses is sent as "launch I failed: ERROR"; no further child is
launched and the exit code is 2. With --leave it ends right after launching instead (returning, or
raising an exception): its children die with it.

With --recurse D it launches itself with --recurse D+1 and relays its child's messages, until a
launch fails (the server's cap on nesting depth): that instance sends "D: ERROR". With --forge H it
waits for and cancels child handle H, which it never launched: it sends both errors.
"""

import json

import inferlet
from inferlet.arguments import text, whole

ARGS = inferlet.ArgumentParser("launch-caller", __doc__)
MODE = ARGS.add_mutually_exclusive_group()
MODE.add_argument("--recurse", metavar="D", type=whole(0), help="launch itself with --recurse D+1 (no N PROMPT K)")
MODE.add_argument("--forge", metavar="H", type=whole(0), help="wait for and cancel child handle H (no N PROMPT K)")
ARGS.add_argument("count", metavar="N", type=whole(0), nargs="?", help="the children to launch")
ARGS.add_argument("prompt", metavar="PROMPT", nargs="?", help="child i's prompt is \"PROMPT i\"")
ARGS.add_argument("max_tokens", metavar="K", type=whole(0), nargs="?", help="the children's tokens at most")
ARGS.add_argument("--program", metavar="P", type=text, default="launch-callee",
                  help="the children's program (default %(default)s)")
ARGS.add_argument("--cancel", metavar="I", type=whole(0), help="cancel child I at once")
ARGS.add_argument("--hold", action="store_true", help="passed on to the children")
ARGS.add_argument("--leave", choices=("exit", "raise"), help="end right after launching, returning or raising")


async def fan_out(program: str, cancel: int | None, hold: bool, leave: str | None, count: int, prompt: str,
                  max_tokens: int) -> int:
    children = []
    for i in range(count):
        try:
            children.append(inferlet.launch(program, [f"{prompt} {i}", str(max_tokens), *(["--hold"] if hold else [])]))
        except inferlet.OvenError as err:
            inferlet.send(f"launch {i} failed: {err}")
            break
    if cancel is not None and cancel < len(children):
        children[cancel].cancel()
    if leave == "exit":
        return 0
    if leave == "raise":
        raise RuntimeError("launch-caller left its children")
    joined = []
    for i, child in enumerate(children):
        state, code, error, messages = await child.wait()
        inferlet.send(json.dumps({"child": i, "state": state, "code": code, "error": error, "messages": messages}))
        joined += messages
    inferlet.send("\n".join(joined))
    return 0 if len(children) == count else 2


async def recurse(depth: int) -> int:
    try:
        child = inferlet.launch("launch-caller", ["--recurse", str(depth + 1)])
    except inferlet.OvenError as err:
        inferlet.send(f"{depth}: {err}")
        return 0
    state, code, error, messages = await child.wait()
    for message in messages:
        inferlet.send(message)
    return code


async def forge(handle: int) -> int:
    child = inferlet.Child(handle)
    try:
        child.cancel()
    except inferlet.OvenError as err:
        inferlet.send(f"cancel: {err}")
    try:
        await child.wait()
    except inferlet.OvenError as err:
        inferlet.send(f"wait: {err}")
    return 0


async def main(args: list[str]) -> int:
    opt = ARGS.parse(args)
    fan = (opt.count, opt.prompt, opt.max_tokens)
    if opt.recurse is not None or opt.forge is not None:
        if fan != (None, None, None):
            ARGS.error("--recurse and --forge take no N PROMPT K")
        return await recurse(opt.recurse) if opt.forge is None else await forge(opt.forge)
    if None in fan:
        ARGS.error("give N PROMPT K, or --recurse D, or --forge H")
    return await fan_out(opt.program, opt.cancel, opt.hold, opt.leave, *fan)


WitWorld = inferlet.run(main)

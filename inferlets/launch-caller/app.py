"""launch-caller: launches inferlets and awaits them (Pie's launch-caller), on the Python SDK.

Arguments: [--program P] [--cancel I] [--hold] [--leave exit|raise] N PROMPT K
  Launches N children of program P (default launch-callee), child i with arguments
  ["PROMPT i", K] (and --hold, passed on), cancels child I at once if asked, awaits every child in
  order and sends, for each, one JSON message {"child", "state", "code", "error", "messages"}; then
  one message with all their messages joined by newlines. A launch the server refuses is sent as
  "launch I failed: ERROR"; no further child is launched and the exit code is 2. With --leave it
  ends right after launching instead (returning, or raising an exception): its children die with it.
Or: --recurse D
  Launches itself with --recurse D+1 and relays its child's messages, until a launch fails (the
  server's cap on nesting depth): that instance sends "D: ERROR".
Or: --forge H
  Waits for and cancels child handle H, which it never launched: sends both errors.
"""

import json

import inferlet

USAGE = "usage: launch-caller [--program P] [--cancel I] [--hold] [--leave exit|raise] N PROMPT K"


async def fan_out(program: str, cancel: int | None, hold: bool, leave: str, count: int, prompt: str,
                  max_tokens: str) -> int:
    children = []
    for i in range(count):
        try:
            children.append(inferlet.launch(program, [f"{prompt} {i}", max_tokens, *(["--hold"] if hold else [])]))
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
    if args[:1] == ["--recurse"]:
        return await recurse(int(args[1]))
    if args[:1] == ["--forge"]:
        return await forge(int(args[1]))
    program, cancel, hold, leave = "launch-callee", None, False, ""
    while args and args[0].startswith("--"):
        flag, args = args[0], args[1:]
        if flag == "--program":
            program, args = args[0], args[1:]
        elif flag == "--cancel":
            cancel, args = int(args[0]), args[1:]
        elif flag == "--hold":
            hold = True
        elif flag == "--leave":
            leave, args = args[0], args[1:]
        else:
            raise SystemExit(f"unknown option {flag}; {USAGE}")
    if len(args) != 3:
        raise SystemExit(USAGE)
    return await fan_out(program, cancel, hold, leave, int(args[0]), args[1], args[2])


WitWorld = inferlet.run(main)

"""bench-calls: a benchmark inferlet that times control-handled API calls from inside the guest.

Used by ``bench/control_overhead.py``; it never touches the GPU. Arguments:

  calls OP REPS BLOCK  time OP (``now-ms``, ``tokenize``, ``poll``, or ``baseline``: a guest
                       function that does nothing, the cost of the timing loop itself) in REPS
                       blocks of BLOCK calls, yielding to the host between blocks so concurrent
                       instances interleave; sends "OP MEDIAN_NS" (median ns per call over blocks)
  ack                  send "ack" at once, then wait for a client message (the launch benchmark
                       measures the time to that first message)
"""

import time

from oven_inferlet import world
from wit_world.imports import futures, messaging, runtime, tokenize

TEXT = "The quick brown fox jumps over the lazy dog."


def _nothing():
    return 0


def _op(name, pending):
    if name == "now-ms":
        return runtime.now_ms
    if name == "tokenize":
        return lambda: tokenize.tokenize(TEXT)
    if name == "poll":
        return lambda: futures.poll([pending])
    if name == "baseline":
        return _nothing
    raise ValueError(f"unknown op {name!r}")


def calls(name, reps, block):
    pending = messaging.receive()  # never completes here: poll always finds it not ready
    call = _op(name, pending)
    per_call_ns = []
    for _ in range(reps):
        start = time.perf_counter_ns()
        for _ in range(block):
            call()
        per_call_ns.append((time.perf_counter_ns() - start) / block)
        nap = runtime.sleep(0)
        yield [nap]
        futures.take_unit(nap)
    futures.discard(pending)
    per_call_ns.sort()
    messaging.send(f"{name} {per_call_ns[len(per_call_ns) // 2]:.1f}")


def ack():
    messaging.send("ack")
    yield [messaging.receive()]


def main():
    args = runtime.arguments()
    if args and args[0] == "calls" and len(args) == 4:
        yield from calls(args[1], int(args[2]), int(args[3]))
    elif args == ["ack"]:
        yield from ack()
    else:
        raise ValueError("usage: bench-calls calls OP REPS BLOCK | ack")


WitWorld = world(main)

"""hostile: misbehaves on purpose, to prove that only the misbehaving instance suffers.

Argument: one of
  spin            loop forever without yielding (the slice deadline must stop it)
  memory          grow memory without bound (the store's memory limit must stop it)
  hoard           grow memory 16 MiB at a time, waiting a moment after each: many together hold
                  more than one may (the client's share must stop them)
  forged          use KvPage and embed handles it was never given
  double-free     free the same pages twice
  use-after-free  forward over pages it already freed
  quota           allocate more pages than its quota
  trap            raise an exception
  early-take      take a message before it arrived (the host refuses: the instance is killed)
  export-trap     export two KvPages by name, then raise (a killed exporter's exports go with it)
  flood N         send N messages "m<i>" and print N lines "line <i>", waiting 0 ms after each:
                  output faster than a slow client reads (the server holds it back, losing nothing)
  deaf            sleep for an hour, never reading what clients send (its inbox must stay bounded)
  tokenize KIB    tokenize KIB KiB of text (past the host's limit, it is refused: the instance dies)
  sleepers N      start N sleeps of an hour, wait for none and exit: its timers must go with it (and
                  past the futures an instance may hold, the host kills it)
  bad-types       call every host function with a wrongly typed first argument: each must raise a
                  TypeError here (sent as "module.function TypeError"), none may trap the component
  hold-kv D H     take H KvPages to the host tier (one at a time) and D on the device, send
                  "holding D + H", then hold them idle until a client message comes; then free them
                  and send "released" (a client that takes a full pool must give way to others)
Errors the host reports are sent to the client as "error: <text>" lines; the
inferlet then exits with code 3.
"""

import importlib
import inspect
import typing

from componentize_py_types import Err
from host_boundary import INTERFACES
from oven_inferlet import wait_all, world
from wit_world.imports import embeds, forward, futures, kvpages, messaging, runtime, tokenize


def report(error):
    messaging.send(f"error: {error.value if isinstance(error, Err) else error}")
    runtime.set_exit_code(3)


def main():
    mode = runtime.arguments()[0]
    if mode == "spin":
        while True:
            pass
    if mode == "memory":
        hoard = []
        while True:
            hoard.append(bytearray(16 << 20))
    if mode == "tokenize":
        tokens = tokenize.tokenize("ab " * ((int(runtime.arguments()[1]) << 10) // 3))
        messaging.send(f"{len(tokens)} tokens")
        return
    if mode == "hoard":
        hoard = []
        while True:
            hoard.append(bytearray(16 << 20))
            yield from wait_all([runtime.sleep(0)])
    if mode == "trap":
        raise RuntimeError("hostile inferlet gave up")
    if mode == "bad-types":
        yield from call_with_bad_types()
        return
    if mode == "early-take":
        futures.take_text(messaging.receive())
    if mode == "flood":
        for i in range(int(runtime.arguments()[1])):
            messaging.send(f"m{i}")
            print(f"line {i}", flush=True)
            yield from wait_all([runtime.sleep(0)])
        return
    if mode == "deaf":
        yield from wait_all([runtime.sleep(3_600_000)])
        return
    if mode == "sleepers":
        naps = [runtime.sleep(3_600_000) for _ in range(int(runtime.arguments()[1]))]
        messaging.send(f"{len(naps)} sleeps started")
        return
    if mode == "hold-kv":
        device, host = int(runtime.arguments()[1]), int(runtime.arguments()[2])
        held = []
        for _ in range(host):
            f = kvpages.alloc_kvpages(0, 1)
            yield from wait_all([f])
            page = futures.take_handles(f)
            f = kvpages.offload_kvpages(0, page)
            yield from wait_all([f])
            futures.take_unit(f)
            held += page
        f = kvpages.alloc_kvpages(0, device)
        yield from wait_all([f])
        held += futures.take_handles(f)
        messaging.send(f"holding {device} + {host}")
        f = messaging.receive()
        yield from wait_all([f])
        futures.take_text(f)
        f = kvpages.dealloc_kvpages(0, held)
        yield from wait_all([f])
        futures.take_unit(f)
        messaging.send("released")
        return
    if mode == "quota":
        f = kvpages.alloc_kvpages(0, 1 << 20)
        yield from wait_all([f])
        try:
            futures.take_handles(f)
        except Err as e:
            report(e)
        return
    f = kvpages.alloc_kvpages(0, 2)
    yield from wait_all([f])
    pages = futures.take_handles(f)
    f = embeds.alloc_embeds(0, 2)
    yield from wait_all([f])
    slots = futures.take_handles(f)
    if mode == "export-trap":
        kvpages.export_kvpages(pages, "hostile/export-trap")
        raise RuntimeError("hostile inferlet exported, then gave up")
    if mode == "forged":
        f = forward.forward(0, [pages[0] + 1000], 1, [slots[0]], [0], [slots[1]], [], 0)
    elif mode == "double-free":
        yield from wait_all([kvpages.dealloc_kvpages(0, pages)])
        f = kvpages.dealloc_kvpages(0, pages)
    elif mode == "use-after-free":
        yield from wait_all([kvpages.dealloc_kvpages(0, pages)])
        f = forward.forward(0, pages, 1, [slots[0]], [0], [slots[1]], [], 0)
    else:
        raise ValueError(f"unknown mode {mode!r}")
    yield from wait_all([f])
    try:
        futures.take_unit(f)
        messaging.send("no error")
    except Err as e:
        report(e)


def call_with_bad_types():
    """Each host function that takes arguments, called with a value of the wrong type first."""
    for interface in INTERFACES:
        module = importlib.import_module(f"wit_world.imports.{interface}")
        for name, function in sorted(vars(module).items()):
            if not inspect.isfunction(function) or function.__module__ != module.__name__:
                continue
            params = list(inspect.signature(function).parameters)
            if not params:
                continue
            first = typing.get_type_hints(function)[params[0]]
            bad = 12345 if first in (str, bytes) else "not a number"  # never what the first parameter takes
            try:
                function(bad, *[None] * (len(params) - 1))
                messaging.send(f"{interface}.{name} accepted it")
            except TypeError:
                messaging.send(f"{interface}.{name} TypeError")
        yield from wait_all([runtime.sleep(0)])


WitWorld = world(main)


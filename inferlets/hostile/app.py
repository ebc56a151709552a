"""hostile: misbehaves on purpose, to prove that only the misbehaving instance suffers.

Argument: one of
  spin            loop forever without yielding (the slice deadline must stop it)
  memory          grow memory without bound (the store's memory limit must stop it)
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
  sleepers N      start N sleeps of an hour, wait for none and exit: its timers must go with it (and
                  past the futures an instance may hold, the host kills it)
Errors the host reports are sent to the client as "error: <text>" lines; the
inferlet then exits with code 3.
"""

from componentize_py_types import Err
from oven_inferlet import wait_all, world
from wit_world.imports import embeds, forward, futures, kvpages, messaging, runtime


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
    if mode == "trap":
        raise RuntimeError("hostile inferlet gave up")
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


WitWorld = world(main)

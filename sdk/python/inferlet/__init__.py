"""oven's Python inferlet SDK: async/await over the host API, a ``Context`` for token sequences
and their KV cache, samplers and stop conditions. The Rust SDK (``sdk/rust/oven``) offers the same;
``sdk/README.md`` has the table of both.

An inferlet's ``app.py``::

    import inferlet

    async def main(args):
        ctx = inferlet.Context()
        ctx.fill_chat([{"role": "user", "content": args[0]}])
        inferlet.send(await ctx.generate(inferlet.Greedy(), inferlet.Stop(max_tokens=64)))

    WitWorld = inferlet.run(main)
"""

from host_boundary import check_imports

check_imports()  # first: a wrongly typed argument to a host function raises TypeError instead of trapping

from .arguments import ArgumentParser
from .children import Child, ChildExit, launch
from .context import Context
from .host import (args, available_traits, broadcast, decode, encode, fetch, instance_id, models, now_ms, open_adapter,
                   page_size, pause_hint, receive, render_chat, send, sleep, stop_tokens, subscribe, vocab_size)
from .queue import Queue
from .sampling import Greedy, MinP, Rng, Sampler, Temperature, TopK, TopP, draw
from .shaping import Grammar, Logprobs, Shape
from .stop import Stop
from .tasks import Future, HostFuture, OvenError, Task, gather, run, spawn

__all__ = [
    "ArgumentParser", "Context", "Queue", "Stop", "Grammar", "Shape", "Logprobs", "Sampler", "Greedy", "Temperature", "TopK", "TopP", "MinP", "Rng", "draw",
    "Future", "HostFuture", "Task", "OvenError", "run", "spawn", "gather",
    "args", "instance_id", "send", "receive", "broadcast", "subscribe", "sleep", "fetch", "now_ms",
    "encode", "decode", "render_chat", "page_size", "stop_tokens", "vocab_size", "models", "available_traits",
    "open_adapter", "pause_hint", "launch", "Child", "ChildExit",
]

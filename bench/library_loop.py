"""A library inferlet run on a real inference process, one instance at a time, timed launch to exit.

Shared by the benches of single inferlets (``jacobi_decoding.py``, ``prefix_tree.py``,
``skeleton_of_thought.py``, ``template.py``): a ``ControlLoop`` over an inference process serving the
model, the inferlet's built component (and any it is compared with) stored in it, and ``run(args)``
giving the seconds it took and the JSON message it sent.
"""

from __future__ import annotations

import json
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from oven.client.build import Inferlet
from oven.client.paths import inferlets_dir
from oven.control.config import ControlConfig, default_program_dir
from oven.control.inference_process import start_inference_process
from oven.control.runtime.loop import ControlLoop
from oven.inference.config import InferenceConfig
from oven.proto.endpoints import private_endpoint


class LibraryLoop:
    def __init__(self, loop: ControlLoop, name: str, events: list):
        self.loop, self.name, self._events = loop, name, events

    def run(self, args: list[str], timeout_s: float = 300) -> tuple[float, dict]:
        """Launch one instance with ``args``, wait for it; (seconds from launch to exit, its one JSON message)."""
        took, (message,) = self.run_program(self.name, args, timeout_s)
        return took, json.loads(message)

    def run_program(self, program: str, args: list[str], timeout_s: float = 300) -> tuple[float, list[str]]:
        """As ``run``, for any program the loop holds: (seconds, every message it sent)."""
        start = time.perf_counter()
        inst = self.loop.launch(program, args)
        if not self.loop.run_until(lambda: not inst.alive, timeout_s):
            raise RuntimeError(f"{program} did not finish in {timeout_s} s")
        took = time.perf_counter() - start
        if inst.exit_code != 0:
            raise RuntimeError(f"{program} failed: {inst.error}")
        return took, [p for i, k, p in self._events if i == inst.instance_id and k == "message"]


@contextmanager
def library_loop(name: str, model: str, threads: int, others: tuple[str, ...] = ()) -> Iterator[LibraryLoop]:
    """The inferlet ``name`` (built: ``oven build inferlets/NAME``), and ``others`` to compare it with, on
    ``model`` with ``threads`` torch threads."""
    built = {}
    for program in (name, *others):
        inferlet = Inferlet.at(inferlets_dir() / program)
        if not inferlet.output.is_file():
            raise SystemExit(f"{inferlet.output} is missing: run `oven build inferlets/{program}`")
        built[program] = inferlet.output.read_bytes()
    config = InferenceConfig(model=model, endpoint=private_endpoint(), torch_threads=threads)
    with start_inference_process(config, timeout_s=300) as inference:
        events: list = []
        loop = ControlLoop(inference.client(),
                           ControlConfig(program_dir=str(Path(default_program_dir()).parent / "bench-programs")),
                           lambda inst, kind, payload: events.append((inst.instance_id, kind, payload)))
        for program, component in built.items():
            loop.programs.add(component, program)
        try:
            yield LibraryLoop(loop, name, events)
        finally:
            loop.close()

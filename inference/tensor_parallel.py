"""Tensor parallelism: one inference process group of N ranks over torch.distributed.

The design is SPMD, every rank the same program on its shard of the weights:

* Rank 0 is the inference server: it owns the ZeroMQ socket. Before its device thread runs a
  request, it broadcasts the request and the sending peer's identity to ranks 1..N-1
  (:meth:`TensorParallelGroup.lead`), which run it too (:meth:`TensorParallelGroup.follow`): every
  request, in order (batches, adapter loads and unloads, freed futures and decoders, offloads,
  restores, copies, info), so each rank keeps the same per-peer token futures and decoders.
* Each layer's attention and MLP end in an all-reduce of the ranks' partial sums
  (:mod:`oven.inference.sharding`), after which the hidden states are the same bits on every rank.
  So the replicated LM head, sampling, grammar matchers and token futures agree on every rank
  without a word between them, and only rank 0's reply is sent. (Ranks on machines whose CPUs pick
  other kernels for the LM head could round differently; their sampled tokens could then part
  ways on a near tie.)
* Each rank's KV pool holds its kv heads; the ranks agree on the smallest page count at start,
  so the pool rank 0's info reports is every rank's. An adapter load succeeds on every rank or on
  none: a folder missing on one host must not leave the ranks' batches different.
* Ranks meet by torch.distributed's ``env://`` rendezvous (MASTER_ADDR, MASTER_PORT, as torchrun).
  Rank 0 started plainly starts ranks 1..N-1 itself, on a free loopback port, as children that die
  with it. A rank started with ``--tp-rank K`` is that rank alone and the others join it, from this
  host or others; every rank but 0 takes rank 0's settings. Requests travel over gloo (CPU
  objects); the all-reduces over gloo on the CPU and NCCL on CUDA, one device (``cuda:K``, or
  ``LOCAL_RANK``) per rank.
* A dead rank ends the group: rank 0 notices a child's exit (a watcher thread) or a failed
  collective, writes ``tensor-parallel rank K died: ...`` and exits non-zero, so whatever
  supervises it restarts the whole group; a rank whose rank 0 is gone exits too (its lifeline, or
  the broken connection). A rank that fails a batch alone (out of memory on one device) leaves the
  others waiting in a collective: the control side's batch timeout, or ``COMPUTE_TIMEOUT``, ends it.
"""

from __future__ import annotations

import logging
import os
import socket
import subprocess
import sys
import threading
import time
from collections import defaultdict
from datetime import timedelta

import torch
import torch.distributed as dist

from oven.proto import inference as p
from oven.proto.lifeline import lifeline_env

from .config import InferenceConfig
from .device import resolve_device
from .token_futures import TokenFutures

log = logging.getLogger(__name__)

BACKENDS = {"cpu": "gloo", "cuda": "nccl"}  # of the all-reduces; requests always go over gloo
RENDEZVOUS_TIMEOUT = timedelta(minutes=10)  # for every rank to come (a rank on another host may start later)
COMPUTE_TIMEOUT = timedelta(minutes=10)  # ranks reach each all-reduce together: longer is a hung rank
IDLE_TIMEOUT = timedelta(days=365)  # ranks > 0 wait for rank 0's next request as long as it is idle
EXIT_RANK_DIED = 3
_WATCH_S = 0.1
_STOP = None  # what rank 0 broadcasts instead of a request when it stops


class TensorParallelGroup:
    """This process's place in the group: :meth:`start`, then :meth:`join`."""

    def __init__(self, rank: int, world_size: int, children: dict[int, subprocess.Popen]):
        self.rank, self.world_size = rank, world_size
        self.device = torch.device("cpu")
        self._children = children
        self._closing = False
        self._requests = self._compute = None  # rank 0's requests' group and the all-reduces' (join)
        if children:  # from before the rendezvous: a child that fails to start must not leave this waiting
            threading.Thread(target=self._watch, name="tensor-parallel-watch", daemon=True).start()

    @classmethod
    def start(cls, cfg: InferenceConfig) -> "TensorParallelGroup":
        """This process's rank of the group ``cfg`` describes; when ``cfg.tp_rank`` is None that is rank 0,
        and ranks 1..N-1 start now as its children (loading beside it). :meth:`join` then meets them."""
        if cfg.tp_rank is not None:
            if not {"MASTER_ADDR", "MASTER_PORT"} <= os.environ.keys():
                raise ValueError("--tp-rank needs MASTER_ADDR and MASTER_PORT in the environment (rank 0's host "
                                 "and a free port there, as torchrun)")
            return cls(cfg.tp_rank, cfg.tensor_parallel, {})
        os.environ["MASTER_ADDR"] = "127.0.0.1"
        os.environ["MASTER_PORT"] = str(_free_port())
        n = cfg.tensor_parallel
        return cls(0, n, {k: _start_rank(k, n) for k in range(1, n)})

    def join(self, cfg: InferenceConfig) -> InferenceConfig:
        """Meet the other ranks (blocks until all have come); -> rank 0's settings, which every rank takes."""
        try:
            dist.init_process_group("gloo", init_method="env://", rank=self.rank, world_size=self.world_size,
                                    timeout=RENDEZVOUS_TIMEOUT)
        except (RuntimeError, ValueError) as exc:  # (no rank 0 there in time, a port in use)
            raise RuntimeError(f"tensor-parallel rendezvous at {os.environ['MASTER_ADDR']}:"
                               f"{os.environ['MASTER_PORT']} failed: {exc}") from None
        settings = [cfg]
        dist.broadcast_object_list(settings, src=0)
        cfg = settings[0].replace(tp_rank=cfg.tp_rank)
        self.device = resolve_device(cfg.device)
        if self.device.type == "cuda":
            self.device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", self.rank)))
            torch.cuda.set_device(self.device)
        self._requests = dist.new_group(backend="gloo", timeout=IDLE_TIMEOUT)
        self._compute = dist.new_group(backend=BACKENDS[self.device.type], timeout=COMPUTE_TIMEOUT)
        return cfg

    # -- what every rank runs ------------------------------------------------------------------------

    def all_reduce(self, tensor: torch.Tensor) -> None:
        """Sum ``tensor`` over the ranks, in place; a failure ends this process (the group is broken)."""
        try:
            dist.all_reduce(tensor, group=self._compute)
        except RuntimeError as exc:
            self._fail(exc)

    def agree_min(self, value: int) -> int:
        """The smallest of every rank's ``value``."""
        tensor = torch.tensor([value], dtype=torch.int64)
        dist.all_reduce(tensor, op=dist.ReduceOp.MIN)
        return int(tensor.item())

    def lead(self, engine, peer: bytes, request, futures):
        """Rank 0: send ``request`` (from ``peer``) to the other ranks, then run it here; the reply."""
        try:
            dist.broadcast_object_list([(peer, request)], src=0, group=self._requests)
        except RuntimeError as exc:
            self._fail(exc)
        return self._run(engine, request, futures)

    def follow(self, engine) -> None:
        """Ranks > 0: run what rank 0 sends, with each peer's own token futures, until it stops."""
        futures_by_peer = defaultdict(lambda: TokenFutures(engine.llg_tokenizer))
        while True:
            message = [_STOP]
            try:
                dist.broadcast_object_list(message, src=0, group=self._requests)
            except RuntimeError as exc:
                self._fail(exc)
            if message[0] is _STOP:
                return
            peer, request = message[0]
            try:
                self._run(engine, request, futures_by_peer[peer])
            except Exception as exc:  # rank 0 failed it too and answered for it
                log.warning("rank %d: %s failed: %s: %s", self.rank, type(request).__name__, type(exc).__name__, exc)

    def close(self) -> None:
        """Rank 0 tells the others to stop and waits for its children; every rank leaves the group."""
        self._closing = True
        if self.rank == 0:
            try:
                dist.broadcast_object_list([_STOP], src=0, group=self._requests)
            except RuntimeError:  # a rank is gone already: nothing to tell it
                pass
        for proc in self._children.values():
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
        dist.destroy_process_group()

    def _run(self, engine, request, futures):
        reply = engine.handle(request, futures)
        if isinstance(request, p.LoadAdapterRequest):
            reply = self._agree_on_adapter(engine, request, reply)
        return reply

    def _agree_on_adapter(self, engine, request: p.LoadAdapterRequest, reply):
        """``reply``, or the error of a rank that could not load the adapter (which the others unload)."""
        mine = reply.message if isinstance(reply, p.ErrorReply) else None
        errors: list[str | None] = [None] * self.world_size
        dist.all_gather_object(errors, mine)
        failed = next(((k, error) for k, error in enumerate(errors) if error is not None), None)
        if failed is None or mine is not None:
            return reply
        engine.unload_adapter(p.UnloadAdapterRequest(request.name))
        return p.ErrorReply(p.ERR_BAD_ADAPTER, f"tensor-parallel rank {failed[0]}: {failed[1]}")

    # -- a dead rank -----------------------------------------------------------------------------------

    def _watch(self) -> None:
        while not self._closing:
            for k, proc in self._children.items():
                if proc.poll() is not None and not self._closing:
                    _die(f"tensor-parallel rank {k} died: {_exit_status(proc.returncode)}")
            time.sleep(_WATCH_S)

    def _fail(self, exc: Exception) -> None:
        """A collective failed: a rank is gone. Name it where it is a child of this process."""
        if self.rank != 0:
            _die(f"tensor-parallel rank {self.rank}: the group broke (rank 0 or another rank is gone): {exc}")
        deadline = time.monotonic() + 2  # a child whose socket closed is about to be reaped
        while time.monotonic() < deadline:
            for k, proc in self._children.items():
                if proc.poll() is not None:
                    _die(f"tensor-parallel rank {k} died: {_exit_status(proc.returncode)}")
            time.sleep(_WATCH_S)
        _die(f"a tensor-parallel rank died: {exc}")


def _die(line: str) -> None:
    """End this process at once from any thread: the group cannot go on, and another thread may be
    blocked in a collective that will never complete."""
    print(f"oven inference: {line}", file=sys.stderr, flush=True)
    os._exit(EXIT_RANK_DIED)


def _exit_status(code: int) -> str:
    return f"killed by signal {-code}" if code < 0 else f"exit status {code}"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _start_rank(rank: int, world_size: int) -> subprocess.Popen:
    """Rank ``rank`` as a child that dies with this process; its stderr is this process's. A session of
    its own, so a Ctrl-C at the terminal reaches rank 0 alone, which stops the group in order."""
    cmd = [sys.executable, "-m", "oven.inference.server", "--quiet", "--tensor-parallel", str(world_size),
           "--tp-rank", str(rank)]
    env = {**os.environ, "LOCAL_RANK": str(rank), **lifeline_env()}
    return subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, env=env,
                            start_new_session=True)

"""The inference process: a ZeroMQ ROUTER that runs one batch per request, in arrival order.

Replies go back on the envelope the request came with, so DEALER and REQ
peers both work. Nothing a peer sends can stop the loop: an undecodable
message gets an :class:`ErrorReply`, a bad item an :class:`ItemError`, and a
failing batch an ``internal`` error on each of its items. When the queue runs
dry the server sends an :class:`IdleNotice` to every peer it served since the
last one, so the control layer can dispatch the next batch at once
(work-conserving scheduling).

A control process starts this server with a key pair in its environment
(:func:`oven.proto.auth.take_inference_keys`): it then speaks CurveZMQ and admits
that control process alone. It binds before it loads the model, so an endpoint in
use fails at once, and it dies with the parent that started it.

Run it with ``oven inference --help`` or ``python -m oven.inference.server``.
"""

from __future__ import annotations

import argparse
import logging
import os
import queue
import signal
import sys
import threading
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import zmq

from oven.proto import inference as p
from oven.proto.auth import Admission, Keypair, join_keys, secure_server, take_inference_keys
from oven.proto.codec import ProtocolError
from oven.proto.config_loader import add_config_arguments, config_from_args
from oven.proto.endpoints import EndpointError, bind, default_inference_endpoint
from oven.proto.lifeline import die_with_parent, parent_alive

from .config import InferenceConfig
from .engine import BatchTooLarge, Engine
from .models import resolve_model
from .sharding import check_shardable
from .tensor_parallel import TensorParallelGroup
from .timeline import Timeline
from .token_futures import TokenFutures

log = logging.getLogger(__name__)

MAX_MESSAGE_BYTES = 256 << 20


@dataclass
class _Job:
    """A decoded request on its way from the wire thread to the device thread."""
    envelope: list[bytes]  # the ROUTER envelope its reply goes back on
    request_id: int
    request: Any
    num_items: int | None  # a batch's item count (for the timeline), else None


class InferenceServer:
    """Binds ``endpoint`` at once; serves once :meth:`serve_forever` is given the engine.

    Two threads, so the device never waits on the wire (xLLM's overlap, one level down). The
    *wire* thread owns the socket: it receives and decodes the next request and encodes and sends
    the last reply while the *device* thread runs a batch (torch releases the GIL while it
    computes). Decoding and encoding right after a forward are slow (70 us against 8 us warm on
    SmolLM2: the weights have flushed the caches), and in one thread that time sat between two
    steps. The device thread runs requests strictly in arrival order, as before.
    """

    def __init__(self, endpoint: str, keys: tuple[Keypair, bytes] | None = None, timeline_batches: int = 0):
        """``keys``: this server's key pair and the one client public key it admits (else no security);
        ``timeline_batches``: how many batches the timeline keeps (0: none)."""
        self.engine: Engine | None = None
        self.group: TensorParallelGroup | None = None
        self.timeline = Timeline(timeline_batches)
        self.endpoint = endpoint
        self._ctx = zmq.Context.instance()
        self._sock = self._ctx.socket(zmq.ROUTER)
        self._sock.setsockopt(zmq.LINGER, 0)
        self._sock.setsockopt(zmq.MAXMSGSIZE, MAX_MESSAGE_BYTES)  # a peer cannot make us buffer gigabytes
        if keys is not None:
            server_keys, client_public = keys
            self._admission = Admission(self._ctx, {client_public: "control"})
            secure_server(self._sock, server_keys, self._admission)
        bind(self._sock, endpoint)
        self._stopping = False
        self._token_futures_by_peer: dict[bytes, TokenFutures] = {}
        self._jobs: queue.SimpleQueue[_Job] = queue.SimpleQueue()  # wire -> device, in arrival order
        self._replies: deque[tuple[_Job, Any]] = deque()  # device -> wire; a byte on _wake says one is in
        wake = f"inproc://oven-inference-replies-{id(self)}"
        self._wake_in = self._ctx.socket(zmq.PAIR)  # the wire thread's end
        self._wake_in.bind(wake)
        self._wake_out = self._ctx.socket(zmq.PAIR)  # the device thread's end
        self._wake_out.connect(wake)

    def stop(self, *_args) -> None:
        self._stopping = True

    def serve_forever(self, engine: Engine, poll_ms: int = 100, group: TensorParallelGroup | None = None) -> None:
        """Run the device thread here and the wire thread beside it until :meth:`stop` or the parent dies;
        ``group``: the tensor-parallel group this process leads, which runs every request with it."""
        self.engine, self.group = engine, group
        wire = threading.Thread(target=self._wire_loop, args=(poll_ms,), name="inference-wire", daemon=True)
        wire.start()
        while not self._stopping:
            try:
                job = self._jobs.get(timeout=poll_ms / 1000)
            except queue.Empty:
                if not parent_alive():
                    log.warning("the process that started this server is gone: exiting")
                    break
                if not wire.is_alive():
                    if not self._stopping:  # (after stop() it ends of itself)
                        log.error("the wire thread died: exiting")
                    break
                continue
            self._replies.append((job, self._run(job)))
            self._wake_out.send(b"")
        self._stopping = True
        wire.join()
        for sock in (self._wake_out, self._wake_in, self._sock):
            sock.close(0)

    # -- the device thread ------------------------------------------------------------------------
    def _run(self, job: _Job):
        """Run one decoded request; never raises."""
        request = job.request
        if isinstance(request, p.TimelineRequest):  # in order: it sees every batch sent before it
            return self.timeline.reply(request.clear)
        try:
            start_ns = time.monotonic_ns()
            peer = job.envelope[0]
            futures = self._token_futures_by_peer.get(peer)
            if futures is None:
                futures = self._token_futures_by_peer[peer] = TokenFutures(self.engine.llg_tokenizer)
            if self.group is None:
                reply = self.engine.handle(request, futures)
            else:
                reply = self.group.lead(self.engine, peer, request, futures)
            if job.num_items is not None:  # when the device ran it
                self.timeline.record(p.CODEC.tag(type(request)), job.num_items, start_ns, time.monotonic_ns())
            return reply
        except BatchTooLarge as exc:
            return p.ErrorReply("batch_too_large", str(exc))
        except Exception as exc:  # a failing batch must not take the server down
            log.exception("batch %s failed", type(request).__name__)
            return _internal_failure(request, exc)

    # -- the wire thread --------------------------------------------------------------------------
    def _wire_loop(self, poll_ms: int) -> None:
        poller = zmq.Poller()
        poller.register(self._sock, zmq.POLLIN)
        poller.register(self._wake_in, zmq.POLLIN)
        queued = 0  # requests handed to the device thread and not yet answered
        served_since_idle: set[bytes] = set()
        while not self._stopping:
            ready = dict(poller.poll(poll_ms))
            if self._wake_in in ready:
                while self._wake_in.poll(0, zmq.POLLIN):
                    self._wake_in.recv()
                while self._replies:
                    job, reply = self._replies.popleft()
                    self._sock.send_multipart([*job.envelope, p.CODEC.encode(reply, job.request_id)])
                    served_since_idle.add(job.envelope[0])
                    queued -= 1
            if self._sock in ready:
                frames = self._sock.recv_multipart()
                if len(frames) >= 2:  # a ROUTER always prepends the identity; nothing to answer to otherwise
                    envelope, payload = frames[:-1], frames[-1]
                    decoded = self._decode(envelope, payload)
                    if isinstance(decoded, _Job):
                        queued += 1
                        self._jobs.put(decoded)
                    else:  # refused before the device saw it
                        self._sock.send_multipart([*envelope, decoded])
                        served_since_idle.add(envelope[0])
            if served_since_idle and not queued and not self._sock.poll(0, zmq.POLLIN):
                self._announce_idle(served_since_idle)

    def _decode(self, envelope: list[bytes], payload: bytes) -> _Job | bytes:
        """The request as a job for the device thread, or the encoded error that refuses it."""
        codec = p.CODEC
        head = codec.peek_list_length(payload, "items")  # (request_id, class, number of items)
        batch = head is not None and head[1] in p.BATCH_REQUESTS
        if batch:
            try:
                self.engine.check_batch_size(head[2])
            except BatchTooLarge as exc:  # refused before a single item is decoded
                return codec.encode(p.ErrorReply("batch_too_large", str(exc)), head[0])
        try:
            decoded = codec.decode(payload)
        except ProtocolError as exc:
            return codec.encode(p.ErrorReply("malformed", str(exc)), codec.peek_request_id(payload))
        request = decoded.message
        if not isinstance(request, p.TimelineRequest) and type(request) not in self.engine.handlers:
            return codec.encode(p.ErrorReply("not_a_request", f"{type(request).__name__} is not a request"),
                                decoded.request_id)
        return _Job(envelope, decoded.request_id, request, head[2] if batch else None)

    def _announce_idle(self, served: set[bytes]) -> None:
        notice = p.CODEC.encode(p.IdleNotice(self.engine.num_batches))
        for identity in served:
            self._sock.send_multipart([identity, notice])
        served.clear()


def _internal_failure(request, exc: Exception):
    """Every item of a batch that crashed gets the same internal error."""
    if not isinstance(request, p.BATCH_REQUESTS):
        return p.ErrorReply(p.ERR_INTERNAL, f"{type(exc).__name__}: {exc}")
    errors = [p.ItemError(p.ERR_INTERNAL, f"{type(exc).__name__}: {exc}")] * len(request.items)
    if isinstance(request, p.NextDistRequest):
        return p.NextDistReply(errors, [None] * len(errors))
    if isinstance(request, p.ForwardTextRequest):
        return p.ForwardTextReply(errors, [None] * len(errors), [None] * len(errors))
    return p.AckReply(errors)


def build_parser() -> argparse.ArgumentParser:
    """``oven inference``'s flags (``oven`` hands them over unparsed; docs/cli.md lists them)."""
    parser = argparse.ArgumentParser(prog="oven inference", description="Run one inference process (a ZeroMQ ROUTER).")
    add_config_arguments(parser, InferenceConfig)
    parser.add_argument("--quiet", action="store_true", help="no progress output while loading")
    parser.add_argument("--join", metavar="KEYFILE",
                        help="serve a control process on another host (oven serve --remote-replicas ENDPOINT=TOKEN): "
                             "keep this process's keys in KEYFILE (made readable by you alone; reused when it exists, "
                             "so a restart admits the same control process) and print the token it connects with")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    who = f"inference rank {args.tp_rank}" if args.tp_rank else "inference"
    logging.basicConfig(level=logging.WARNING if args.quiet else logging.INFO,
                        format=f"%(asctime)s {who} %(levelname)s %(message)s", stream=sys.stderr)
    die_with_parent()
    group = None
    try:
        cfg = config_from_args(InferenceConfig, args)
        if cfg.tensor_parallel > 1 and cfg.tp_rank:
            return _follow(cfg, quiet=args.quiet)
        keys, token = take_inference_keys(), None
        if args.join:
            server_keys, token = join_keys(Path(args.join))
            keys = (server_keys, token.client.public)
        server = InferenceServer(cfg.endpoint or default_inference_endpoint(), keys, cfg.timeline_batches)
        if token is not None:  # the token alone on stdout, for scripts; how to use it on stderr
            print(token, flush=True)
            print(f"oven inference: the control process joins with: oven serve --remote-replicas "
                  f"{server.endpoint}=@FILE (FILE holding the token printed above; this host's address in place "
                  "of a wildcard)", file=sys.stderr, flush=True)
        signal.signal(signal.SIGTERM, server.stop)
        signal.signal(signal.SIGINT, server.stop)
        if cfg.tensor_parallel > 1:
            group = TensorParallelGroup.start(cfg)
        source = resolve_model(cfg.model)
        if group is not None:
            check_shardable(source.config, cfg.tensor_parallel)  # before the group forms: the others wait
            cfg = group.join(cfg)
        engine = Engine(cfg, not args.quiet, source, group)
    except (ValueError, FileNotFoundError, RuntimeError, EndpointError) as exc:
        print(f"oven inference: {exc}", file=sys.stderr)
        return 2
    print(f"oven inference: serving {engine.model.config.name} on {server.endpoint}"
          + (f" with {cfg.tensor_parallel} tensor-parallel ranks" if group else ""), file=sys.stderr, flush=True)
    server.serve_forever(engine, group=group)
    if group is not None:
        group.close()
    return 0


def _follow(cfg: InferenceConfig, quiet: bool) -> int:
    """Tensor-parallel rank ``cfg.tp_rank`` > 0: no socket; it runs what rank 0 sends until rank 0 stops."""
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # (a rank between batches has nothing to finish)
    group = TensorParallelGroup.start(cfg)
    cfg = group.join(cfg)
    engine = Engine(cfg, not quiet, group=group)
    group.follow(engine)
    group.close()
    return 0


if __name__ == "__main__":
    status = main()
    # Everything is closed by now; the interpreter's own teardown of torch's modules would add about a
    # second to every stop (and so to every restart) for nothing the OS does not release anyway.
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)

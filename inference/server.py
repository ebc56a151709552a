"""The inference process: a ZeroMQ ROUTER that runs one batch per request.

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
import signal
import sys
import time

import zmq

from oven.proto import inference as p
from oven.proto.auth import Admission, Keypair, secure_server, take_inference_keys
from oven.proto.codec import ProtocolError
from oven.proto.config_loader import add_config_arguments, config_from_args
from oven.proto.endpoints import EndpointError, bind, default_inference_endpoint
from oven.proto.lifeline import die_with_parent, parent_alive

from .config import InferenceConfig
from .engine import BatchTooLarge, Engine
from .timeline import Timeline
from .token_futures import TokenFutures

log = logging.getLogger(__name__)

MAX_MESSAGE_BYTES = 256 << 20


class InferenceServer:
    """Binds ``endpoint`` at once; serves once :meth:`serve_forever` is given the engine."""

    def __init__(self, endpoint: str, keys: tuple[Keypair, bytes] | None = None, timeline_batches: int = 0):
        """``keys``: this server's key pair and the one client public key it admits (else no security);
        ``timeline_batches``: how many batches the timeline keeps (0: none)."""
        self.engine: Engine | None = None
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
        self._served_since_idle: set[bytes] = set()
        self._token_futures_by_peer: dict[bytes, TokenFutures] = {}

    def stop(self, *_args) -> None:
        self._stopping = True

    def serve_forever(self, engine: Engine, poll_ms: int = 100) -> None:
        self.engine = engine
        while not self._stopping:
            if not self._sock.poll(poll_ms, zmq.POLLIN):
                if not parent_alive():
                    log.warning("the process that started this server is gone: exiting")
                    break
                continue
            frames = self._sock.recv_multipart()
            if len(frames) < 2:
                continue  # a ROUTER always prepends the identity; nothing to answer to otherwise
            envelope, payload = frames[:-1], frames[-1]
            self._sock.send_multipart([*envelope, self.handle_payload(payload, envelope[0])])
            self._served_since_idle.add(envelope[0])
            if not self._sock.poll(0, zmq.POLLIN):
                self._announce_idle()
        self._sock.close(0)

    def handle_payload(self, payload: bytes, peer: bytes = b"") -> bytes:
        """Decode, run and encode one request from connection ``peer``; never raises."""
        codec = p.CODEC
        head = codec.peek_list_length(payload, "items")  # (request_id, class, number of items)
        batch = head is not None and head[1] in p.BATCH_REQUESTS
        if batch:
            try:
                self.engine.check_batch_size(head[2])
            except BatchTooLarge as exc:  # refused before a single item is decoded
                return codec.encode(p.ErrorReply("batch_too_large", str(exc)), head[0])
        try:
            envelope = codec.decode(payload)
        except ProtocolError as exc:
            return codec.encode(p.ErrorReply("malformed", str(exc)), codec.peek_request_id(payload))
        request = envelope.message
        if isinstance(request, p.TimelineRequest):
            return codec.encode(self.timeline.reply(request.clear), envelope.request_id)
        if type(request) not in self.engine.handlers:
            return codec.encode(p.ErrorReply("not_a_request", f"{type(request).__name__} is not a request"),
                                envelope.request_id)
        try:
            start_ns = time.monotonic_ns()
            futures = self._token_futures_by_peer.get(peer)
            if futures is None:
                futures = self._token_futures_by_peer[peer] = TokenFutures()
            reply = self.engine.handle(request, futures)
            if batch:  # when the device ran it
                self.timeline.record(codec.tag(type(request)), head[2], start_ns, time.monotonic_ns())
        except BatchTooLarge as exc:
            reply = p.ErrorReply("batch_too_large", str(exc))
        except Exception as exc:  # a failing batch must not take the server down
            log.exception("batch %s failed", type(request).__name__)
            reply = _internal_failure(request, exc)
        return codec.encode(reply, envelope.request_id)

    def _announce_idle(self) -> None:
        notice = p.CODEC.encode(p.IdleNotice(self.engine.num_batches))
        for identity in self._served_since_idle:
            self._sock.send_multipart([identity, notice])
        self._served_since_idle.clear()


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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="oven inference", description="Run one inference process (a ZeroMQ ROUTER).")
    add_config_arguments(parser, InferenceConfig)
    parser.add_argument("--quiet", action="store_true", help="no progress output while loading")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING if args.quiet else logging.INFO,
                        format="%(asctime)s inference %(levelname)s %(message)s", stream=sys.stderr)
    die_with_parent()
    try:
        cfg = config_from_args(InferenceConfig, args)
        server = InferenceServer(cfg.endpoint or default_inference_endpoint(), take_inference_keys(),
                                 cfg.timeline_batches)
        signal.signal(signal.SIGTERM, server.stop)
        signal.signal(signal.SIGINT, server.stop)
        engine = Engine(cfg, progress=not args.quiet)
    except (ValueError, FileNotFoundError, RuntimeError, EndpointError) as exc:
        print(f"oven inference: {exc}", file=sys.stderr)
        return 2
    print(f"oven inference: serving {engine.model.config.name} on {server.endpoint}", file=sys.stderr, flush=True)
    server.serve_forever(engine)
    return 0


if __name__ == "__main__":
    sys.exit(main())

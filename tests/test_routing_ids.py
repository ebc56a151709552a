"""A client cannot crash the control ROUTER with routing ids of its choosing (issue 40, row 1).

libzmq names an id-less peer 0x00 + a counter that starts at 0x6b8b4567 in every process, and its
ROUTER aborts the process when it assigns an id a peer already chose. A real `oven serve` (tiny model)
and a client with a token of its own."""

from __future__ import annotations

import zmq

from oven.proto import control as c
from oven.proto.auth import Token, secure_client

from harness import Server

NUM_PLANTED = 200


def test_colliding_routing_ids_neither_crash_the_server_nor_reach_it(tmp_path):
    server, planted = Server(tmp_path), []
    try:
        with server.client() as operator:
            attacker = Token.parse(operator.add_client("mallory"))
        for i in range(NUM_PLANTED):  # the ids libzmq would hand the next connections
            sock = zmq.Context.instance().socket(zmq.DEALER)
            sock.setsockopt(zmq.LINGER, 0)
            sock.setsockopt(zmq.ROUTING_ID, b"\x00" + (0x6B8B4567 + i).to_bytes(4, "big"))
            secure_client(sock, attacker)
            sock.connect(server.endpoint)
            sock.send(c.CODEC.encode(c.ServerInfo(), 1))
            planted.append(sock)
        for sock in planted:  # each is an ordinary connection to the server, under an id the server chose
            assert sock.poll(30_000), "a planted connection got no reply"
            assert type(c.CODEC.decode(sock.recv()).message) is c.ServerInfoReply
        with server.client() as operator:  # a connection that sets no id: libzmq's next ones are planted
            assert operator.info(timeout_s=30).models == ["tiny"]
        assert server.proc.poll() is None
    finally:
        for sock in planted:
            sock.close(0)
        server.stop()

"""What the control server keeps for each client, and what goes with it: frames its ZeroMQ pipe has
no room for wait in order (ClientOutbox); instances it is behind on are held; a client that never
reads is dropped; a vanished client's instances and unfinished upload are freed when its lease lapses
(on a clock the test moves)."""

from __future__ import annotations

import hashlib
import itertools
import re
import threading
import time

import pytest
import zmq

from oven.control import program_requests, server as server_module
from oven.proto.endpoints import private_endpoint
from oven.control.outbox import ClientOutbox
from oven.control.config import ControlConfig
from oven.control.keyring import Keyring
from oven.control.requests import Caller
from oven.control.runtime.instance import State
from oven.control.runtime.loop import ControlLoop
from oven.control.server import ControlServer
from oven.proto import control as c
from oven.proto.auth import OPERATOR

from harness import PROGRAM_DIR, built, fresh_program

PROGRAMS = ["echo"]
_endpoints = itertools.count()


def dealer_at(address: str, identity: bytes = b"", rcvhwm: int = 1000) -> zmq.Socket:
    dealer = zmq.Context.instance().socket(zmq.DEALER)
    dealer.setsockopt(zmq.RCVHWM, rcvhwm)
    if identity:
        dealer.setsockopt(zmq.IDENTITY, identity)
    dealer.connect(address)
    return dealer


def pair(address: str = "") -> tuple[zmq.Socket, zmq.Socket, str]:
    """A ROUTER and a DEALER with pipes of one frame each way; over inproc by default (no kernel
    buffers: the pipes hold exactly that)."""
    ctx = zmq.Context.instance()
    address = address or f"inproc://test-outbox-{next(_endpoints)}"
    router = ctx.socket(zmq.ROUTER)
    router.setsockopt(zmq.SNDHWM, 1)
    router.bind(address)
    dealer = dealer_at(address, b"client", rcvhwm=1)
    dealer.send(b"hello")  # the router learns the identity
    assert router.recv_multipart() == [b"client", b"hello"]
    return router, dealer, address


def test_frames_past_a_full_pipe_wait_and_arrive_in_order():
    router, dealer, _ = pair()
    outbox = ClientOutbox(router, 1)
    frames = [f"frame {i}".encode() for i in range(100)]
    for frame in frames:
        outbox.send(b"client", frame)
    backlog = outbox.backlogs[b"client"]
    assert 90 <= len(backlog.frames) < 100  # the pipes took one or two, the rest wait
    assert backlog.num_bytes == sum(map(len, backlog.frames))
    received, deadline = [], time.monotonic() + 60
    while len(received) < len(frames):  # the router learns that the reader made room a moment later
        assert time.monotonic() < deadline, f"{len(received)} frames arrived"
        outbox.flush()
        if dealer.poll(10):
            while dealer.poll(0):
                received.append(dealer.recv())
    assert received == frames and outbox.backlogs == {}
    router.close(0)
    dealer.close(0)


def test_frames_for_a_client_that_is_gone_are_discarded():
    router, dealer, _ = pair(private_endpoint())  # ipc, as the server: inproc never reports a peer gone
    outbox = ClientOutbox(router, 1)
    outbox.send(b"nobody", b"x")  # never connected: no error, nothing kept
    assert outbox.backlogs == {}
    for _ in range(2000):  # 2 MB: more than the socket's kernel buffers take
        outbox.send(b"client", bytes(1000))
    assert outbox.backlogs
    dealer.close(0)
    deadline = time.monotonic() + 60
    while outbox.backlogs:  # the client left with frames waiting: they go once the router sees it left
        assert time.monotonic() < deadline
        time.sleep(0.01)
        outbox.flush()
    router.close(0)


class Clock:
    """Monotonic time that the test moves on by hand (for leases)."""

    def __init__(self):
        self.offset_s = 0.0

    def __call__(self) -> float:
        return time.monotonic() + self.offset_s


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def control_server(loop, monkeypatch, tmp_path, clock):
    """A server whose pipes hold one frame; what its instances write stays in ``loop.events``."""
    monkeypatch.setattr(server_module, "DROP_FRAMES", 50)
    monkeypatch.setattr(server_module, "PIPE_FRAMES", 1)
    server = ControlServer(f"inproc://test-control-{next(_endpoints)}", Keyring(tmp_path / "state"), loop, clock=clock)
    yield server
    server.close()


@pytest.fixture
def serving(inference, monkeypatch, tmp_path, clock):
    """A server whose pipes hold 8 frames and whose loop sends what instances write to their clients (as
    ``oven serve``), and keeps it in ``loop.events`` too."""
    monkeypatch.setattr(server_module, "PIPE_FRAMES", 8)
    server = ControlServer(f"inproc://test-control-{next(_endpoints)}", Keyring(tmp_path / "state"), clock=clock)
    events = []

    def sink(inst, kind, payload):
        events.append((inst.instance_id, kind, payload))
        server.on_event(inst, kind, payload)
    server.loop = ControlLoop(inference.client(), ControlConfig(program_dir=PROGRAM_DIR, instance_memory_mib=192), sink)
    server.loop.events = events
    server.loop.programs.add(built("echo"), "echo")
    yield server
    server.loop.close()
    server.close()


def turn(server: ControlServer) -> None:
    server.turn()


def test_a_client_that_never_reads_is_dropped_and_its_instance_killed(control_server):
    dealer = dealer_at(control_server.endpoint, rcvhwm=1)
    before = set(control_server.loop.instances)
    dealer.send(c.CODEC.encode(c.Launch("echo", []), 1))
    for _ in range(20):
        turn(control_server)
    (instance_id,) = set(control_server.loop.instances) - before
    inst = control_server.loop.instances[instance_id]
    assert inst.alive
    for request_id in range(2, 200):  # requests whose replies it never reads
        dealer.send(c.CODEC.encode(c.Heartbeat(), request_id))
        turn(control_server)
        if not inst.alive:
            break
    assert not inst.alive and inst.error.startswith("its client stopped reading (")
    assert control_server.outbox.backlogs == {}
    dealer.close(0)


ECHO_BYTES = 512 << 10  # each big echo; a pipe of 8 frames (inproc: and the reader's 1) holds 4.5 MiB of them


def flood_a_reader_that_reads_nothing(server: ControlServer, num_messages: int):
    """An echo launched by a client that then reads nothing (``reader``, heartbeating) while another
    connection (``sender``) has it answer ``num_messages`` big messages: (reader, sender, instance,
    the server's route to the reader, the texts sent)."""
    reader, sender = dealer_at(server.endpoint, b"reader", rcvhwm=1), dealer_at(server.endpoint, b"sender")
    instance_id = request(server, reader, c.Launch("echo", []), 1).instance_id
    (route,) = server._watchers[instance_id]
    texts = [f"{i} " + "x" * ECHO_BYTES for i in range(num_messages)]
    for request_id, text in enumerate(texts, 1):
        sender.send(c.CODEC.encode(c.SendMessage(instance_id, text), request_id))
    return reader, sender, server.loop.instances[instance_id], route, texts


def other_client_is_served(server: ControlServer, reader: zmq.Socket) -> None:
    """Another client's echo answers at once (``reader`` keeps its lease meanwhile)."""
    other = dealer_at(server.endpoint, b"other")
    theirs = request(server, other, c.Launch("echo", []), 1).instance_id
    assert isinstance(request(server, other, c.SendMessage(theirs, "hi"), 2), c.Ok)
    turn_until(server, reader, lambda: messages(server.loop, theirs) == ["echo: hi"])
    server.loop.terminate(theirs, "the test is over")
    other.close(0)


def test_a_reader_that_reads_nothing_is_held_by_the_bytes_in_its_pipe(serving, monkeypatch):
    """Big frames for a client that reads nothing fill ZeroMQ's pipe of PIPE_FRAMES frames, and the server
    counts their bytes: past HOLD_BYTES its instance is held with a frame waiting behind the pipe (not
    HOLD_FRAMES), and runs no further. Another client is served meanwhile; once the reader reads, every
    echo arrives, in order, and its instance runs on."""
    monkeypatch.setattr(server_module, "HOLD_BYTES", 2 << 20)
    reader, sender, inst, route, texts = flood_a_reader_that_reads_nothing(serving, 12)
    turn_until(serving, reader, lambda: inst.output_held)
    # held for the bytes in the pipe, far short of HOLD_FRAMES (how many small frames wait besides depends
    # on how the runner's slices and the server's turns interleave)
    assert len(serving.outbox.backlogs[route].frames) < server_module.HOLD_FRAMES // 10
    assert serving.outbox.unread_bytes(route) > 2 << 20
    echoed = len(messages(serving.loop, inst.instance_id))
    assert echoed < len(texts)
    other_client_is_served(serving, reader)
    assert inst.output_held and len(messages(serving.loop, inst.instance_id)) <= echoed + 1  # one in flight
    received = []
    while len(received) < len(texts):  # now read everything (replies to the heartbeats among it)
        turn_until(serving, reader, lambda: reader.poll(0))
        while reader.poll(0):
            message = c.CODEC.decode(reader.recv()).message
            if isinstance(message, c.InstanceEvent) and message.kind == "message":
                received.append(message.text)
    assert received == [f"echo: {text}" for text in texts]
    turn(serving)
    assert not inst.output_held and route not in serving.outbox.backlogs
    serving.loop.terminate(inst.instance_id, "the test is over")
    for dealer in (reader, sender):
        dealer.close(0)


def test_a_reader_that_reads_nothing_is_dropped_by_the_bytes_in_its_pipe(serving, monkeypatch):
    """Past DROP_BYTES unread, the bytes in ZeroMQ's pipe included, a client that reads nothing is dropped
    (its instance killed) with a frame or two waiting, not DROP_FRAMES; the server forgets what waited
    for it, and another client is served."""
    monkeypatch.setattr(server_module, "HOLD_BYTES", 64 << 20)
    monkeypatch.setattr(server_module, "DROP_BYTES", 2 << 20)
    reader, sender, inst, route, _ = flood_a_reader_that_reads_nothing(serving, 12)
    turn_until(serving, reader, lambda: not inst.alive)
    match = re.fullmatch(r"its client stopped reading \((\d+) frames waiting, (\d+) MiB unread\)", inst.error)
    assert match and int(match[1]) < server_module.HOLD_FRAMES // 10 and int(match[2]) >= 2, inst.error
    assert route not in serving.outbox.backlogs and serving.outbox.unread_bytes(route) == 0
    other_client_is_served(serving, sender)
    for dealer in (reader, sender):
        dealer.close(0)


def test_a_message_past_its_cap_ends_its_sender_alone(loop):
    """An inferlet's ``send`` of more than MAX_MESSAGE_BYTES fails its instance with a clear error; another
    client's instance answers as before."""
    for client in ("mallory", "alice"):
        loop.programs.add(built("echo"), "echo", uploader=client)
    big, small = loop.launch("echo", [], owner="mallory"), loop.launch("echo", [], owner="alice")
    loop.deliver(big.instance_id, "x" * (3 << 19))
    loop.deliver(small.instance_id, "hi")
    assert loop.run_until(lambda: not big.alive and messages(loop, small.instance_id) == ["echo: hi"], 60)
    assert (big.state, big.error) == (State.FAILED, "send: a message is at most 1 MiB, this one is 1.5 MiB "
                                                    "(send it in parts)")
    loop.terminate(small.instance_id, "the test is over")


def test_a_flood_of_requests_is_served_a_share_per_turn(control_server, monkeypatch):
    """A client that sends faster than the server answers is served MAX_REQUESTS_PER_TURN requests a
    turn, and the loop steps between (other clients' instances run, slow clients are dropped)."""
    monkeypatch.setattr(server_module, "MAX_REQUESTS_PER_TURN", 4)
    served = []
    heartbeat = control_server._handlers[c.Heartbeat]
    control_server._handlers[c.Heartbeat] = lambda caller, req: served.append(req) or heartbeat(caller, req)
    dealer = dealer_at(control_server.endpoint, b"flooder")
    for request_id in range(1, 11):
        dealer.send(c.CODEC.encode(c.Heartbeat(), request_id))
    counts = []
    for _ in range(3):
        turn(control_server)
        counts.append(len(served))
    assert counts == [4, 8, 10]
    dealer.close(0)


def request(server: ControlServer, dealer: zmq.Socket, message, request_id: int):
    dealer.send(c.CODEC.encode(message, request_id))
    for _ in range(100):
        turn(server)
        if dealer.poll(0):
            return c.CODEC.decode(dealer.recv()).message
    raise AssertionError("no reply")


def test_unfinished_uploads_are_bounded_and_go_with_their_client(control_server, monkeypatch, clock):
    monkeypatch.setattr(program_requests, "MAX_BUFFERED_UPLOAD_BYTES", 8)
    first, second = (dealer_at(control_server.endpoint, identity) for identity in (b"first", b"second"))
    reply = request(control_server, first, c.UploadChunk("a", "a" * 64, 10, 0, b"12345"), 1)
    assert isinstance(reply, c.UploadReply) and (reply.received_bytes, reply.complete) == (5, False)
    reply = request(control_server, second, c.UploadChunk("b", "b" * 64, 10, 0, b"12345"), 1)
    assert isinstance(reply, c.ControlError) and reply.code == "upload_busy"  # 5 + 5 > 8 buffered
    clock.offset_s += control_server.loop.config.lease_s + 1  # neither has talked since
    turn(control_server)  # both leases lapse: the first upload is freed, nobody will finish it
    reply = request(control_server, second, c.UploadChunk("b", "b" * 64, 10, 0, b"12345"), 2)
    assert isinstance(reply, c.UploadReply) and reply.received_bytes == 5
    first.close(0)
    second.close(0)


def test_one_client_cannot_take_the_whole_upload_buffer(control_server, monkeypatch):
    """Each client may have at most one program's worth (MAX_UPLOAD_BYTES) half uploaded, over all its
    connections: holding that much, it gets upload_busy on another, and another client's upload still
    goes through."""
    monkeypatch.setattr(program_requests, "MAX_UPLOAD_BYTES", 8)

    def upload(route: bytes, name: str, sha: str):
        chunk = c.UploadChunk(sha, sha * 64, 6, 0, b"12345")
        return control_server._answered("UploadChunk", lambda: control_server._upload(Caller(route, name), chunk))

    reply = upload(b"hog-1", "mallory", "a")
    assert isinstance(reply, c.UploadReply) and reply.received_bytes == 5
    for route in (b"hog-1", b"hog-2"):
        reply = upload(route, "mallory", "b")
        assert isinstance(reply, c.ControlError) and reply.code == "upload_busy" and reply.message.startswith(
            "this client has 0.0 MiB of unfinished uploads")
    reply = upload(b"other", "alice", "b")
    assert isinstance(reply, c.UploadReply) and reply.received_bytes == 5


def test_a_last_chunk_refused_for_want_of_a_compile_slot_is_all_that_is_sent_again(control_server, monkeypatch):
    """With every compile slot taken, the chunk that would complete an upload is refused ``upload_busy``
    and not taken: the bytes before it stay buffered, and that chunk alone, sent again once a slot is
    free, completes the upload."""
    wasm = fresh_program("hello-rust")
    half = len(wasm) // 2
    uploader = dealer_at(control_server.endpoint, b"uploader")
    chunk = lambda offset, data: c.UploadChunk("halves", hashlib.sha256(wasm).hexdigest(), len(wasm), offset, data)
    reply = request(control_server, uploader, chunk(0, wasm[:half]), 1)
    assert isinstance(reply, c.UploadReply) and (reply.received_bytes, reply.complete) == (half, False)
    monkeypatch.setattr(program_requests, "MAX_COMPILING", 0)
    reply = request(control_server, uploader, chunk(half, wasm[half:]), 2)
    assert (reply.code, reply.message) == ("upload_busy", "0 programs are compiling already: try again in a few "
                                                          "seconds")
    monkeypatch.setattr(program_requests, "MAX_COMPILING", 4)
    uploader.send(c.CODEC.encode(chunk(half, wasm[half:]), 3))
    reply = next_reply(control_server, uploader)
    assert reply == c.UploadReply(hashlib.sha256(wasm).hexdigest(), len(wasm), True)
    uploader.close(0)


def test_the_client_sends_a_busy_chunk_again(monkeypatch):
    """OvenClient.upload resends a chunk refused ``upload_busy``, the same chunk, after a pause; other
    refusals, and a busy server past ``busy_wait_s``, raise."""
    from oven.client import rpc

    sent, pauses, answers = [], [], []

    def fake_request(self, message, timeout_s=None):
        sent.append((message.offset, len(message.data)))
        answer = answers.pop(0)
        if isinstance(answer, c.ControlError):
            raise rpc.ControlRequestError(answer)
        return answer
    this_thread, sleep = threading.current_thread(), time.sleep

    def pause(seconds: float) -> None:  # time.sleep is every thread's: only this one's pauses are skipped
        if threading.current_thread() is this_thread:
            pauses.append(seconds)
        else:
            sleep(seconds)
    monkeypatch.setattr(rpc.OvenClient, "request", fake_request)
    monkeypatch.setattr(rpc.time, "sleep", pause)
    monkeypatch.setattr(c, "UPLOAD_CHUNK_BYTES", 4)
    busy = c.ControlError("upload_busy", "4 programs are compiling already: try again in a few seconds")
    digest = hashlib.sha256(b"12345678").hexdigest()
    with rpc.OvenClient(private_endpoint(), token="") as client:
        answers[:] = [c.UploadReply(digest, 4, False), busy, busy, c.UploadReply(digest, 8, True)]
        assert client.upload(b"12345678") == digest
        assert sent == [(0, 4), (4, 4), (4, 4), (4, 4)] and pauses == [0.5, 1.0]
        sent.clear()
        answers[:] = [c.ControlError("bad_upload", "chunk at offset 0 does not follow 4 bytes")]
        with pytest.raises(rpc.ControlRequestError, match="^bad_upload"):
            client.upload(b"1234")
        answers[:] = [busy, busy]
        with pytest.raises(rpc.ControlRequestError, match="^upload_busy"):
            client.upload(b"1234", busy_wait_s=0.6)  # one pause of 0.5 s fits, the next does not
        assert sent[-2:] == [(0, 4), (0, 4)]


def test_a_vanished_client_leaks_nothing(control_server, clock):
    """A client that launches without --detach and disappears: its instance dies once the lease lapses,
    and everything it held returns to the pools."""
    full = control_server.loop.snapshot()
    dealer = dealer_at(control_server.endpoint, b"vanishing")
    instance_id = request(control_server, dealer, c.Launch("echo", []), 1).instance_id
    dealer.close(0)
    clock.offset_s += control_server.loop.config.lease_s / 2
    turn(control_server)
    assert control_server.loop.record(instance_id) is not None  # within its lease
    clock.offset_s += control_server.loop.config.lease_s / 2 + 1
    turn(control_server)
    after = control_server.loop.snapshot()
    (record,) = [r for r in after.finished if r.instance_id == instance_id]
    assert (record.shown_state, record.exit_code) == ("killed", 143)
    assert record.error == "its client went away (lease expired)"
    assert (after.num_free_kv_pages, after.num_free_embeds) == (full.num_free_kv_pages, full.num_free_embeds)


def test_a_client_whose_lease_lapsed_is_told_what_it_lost(control_server, monkeypatch, clock):
    """A client silent past its lease (a suspended process, a loaded machine) that comes back is told
    what it lost by its next heartbeat (``dropped``), rather than waiting for events that will not come;
    its other requests are served as usual. Not told: one that held nothing, one that attached again to
    what it watched; the server remembers at most MAX_DROPPED_ROUTES such connections."""
    monkeypatch.setattr(server_module, "MAX_DROPPED_ROUTES", 3)
    owner, watcher, again, idle, forgotten = (dealer_at(control_server.endpoint, identity) for identity in
                                              (b"owner", b"watcher", b"again", b"idle", b"forgotten"))
    request(control_server, forgotten, c.Launch("echo", []), 1)
    request(control_server, owner, c.Launch("echo", []), 1)
    detached = request(control_server, watcher, c.Launch("echo", [], detach=True), 1).instance_id  # it watches
    assert isinstance(request(control_server, again, c.Attach(detached), 1), c.Ok)
    assert isinstance(request(control_server, idle, c.Heartbeat(), 1), c.Alive)
    clock.offset_s += control_server.loop.config.lease_s + 1
    turn(control_server)
    lease = f"the server dropped this connection (it was silent for more than its " \
            f"{control_server.loop.config.lease_s:g} s lease)"
    assert isinstance(request(control_server, owner, c.ListInstances(), 2), c.InstanceList)
    reply = request(control_server, owner, c.Heartbeat(), 3)
    assert (reply.code, reply.message) == ("dropped", f"{lease}: 1 instance(s) it launched attached were killed")
    assert isinstance(request(control_server, owner, c.Heartbeat(), 4), c.Alive)  # told once
    reply = request(control_server, watcher, c.Heartbeat(), 2)
    assert (reply.code, reply.message) == ("dropped", f"{lease}: it no longer receives the output of 1 instance(s)")
    assert isinstance(request(control_server, again, c.Attach(detached), 2), c.Ok)
    assert isinstance(request(control_server, again, c.Heartbeat(), 3), c.Alive)
    assert isinstance(request(control_server, idle, c.Heartbeat(), 2), c.Alive)
    assert isinstance(request(control_server, forgotten, c.Heartbeat(), 2), c.Alive)  # the oldest of four
    assert control_server.loop.record(detached) is not None  # detached: only its watchers went
    for dealer in (owner, watcher, again, idle, forgotten):
        dealer.close(0)


def upload_chunk(data: bytes, name: str) -> c.UploadChunk:
    return c.UploadChunk(name, hashlib.sha256(data).hexdigest(), len(data), 0, data)


def messages(loop, instance_id: str) -> list[str]:
    return [payload for iid, kind, payload in loop.events if iid == instance_id and kind == "message"]


def turn_until(server: ControlServer, dealer: zmq.Socket, done, timeout_s: float = 120) -> None:
    """Turn the server until ``done()``, ``dealer`` keeping its lease meanwhile."""
    deadline = beat = time.monotonic()
    deadline += timeout_s
    while not done():
        assert time.monotonic() < deadline, f"not done in {timeout_s} s"
        if time.monotonic() - beat > 1:
            dealer.send(c.CODEC.encode(c.Heartbeat(), 0))
            beat = time.monotonic()
        turn(server)


def next_reply(server: ControlServer, dealer: zmq.Socket, timeout_s: float = 120):
    """The next message to ``dealer`` that is not the answer to one of its heartbeats (see turn_until)."""
    while True:
        turn_until(server, dealer, lambda: dealer.poll(0), timeout_s)
        message = c.CODEC.decode(dealer.recv()).message
        if not isinstance(message, c.Alive):
            return message


def test_a_compile_stalls_neither_the_server_nor_its_uploaders_lease(control_server, monkeypatch, clock):
    """A new program compiles on a worker thread (here held until the test lets it go): meanwhile the
    server answers requests and runs instances (an echo answers), a second upload of the same client is
    ``upload_busy``, and the uploader, silent past its lease while it waits for its reply, keeps the
    instance it launched attached. The reply comes once the program is stored."""
    programs = control_server.loop.programs
    compiling, release = threading.Event(), threading.Event()
    compile_now = programs.compile

    def held_compile(wasm: bytes):
        compiling.set()
        assert release.wait(120)
        return compile_now(wasm)
    monkeypatch.setattr(programs, "compile", held_compile)
    uploader, other = dealer_at(control_server.endpoint, b"uploader"), dealer_at(control_server.endpoint, b"other")
    kept = request(control_server, uploader, c.Launch("echo", []), 1).instance_id
    wasm = fresh_program("hello-rust")
    uploader.send(c.CODEC.encode(upload_chunk(wasm, "hello-copy"), 2))
    for _ in range(400):
        turn(control_server)
        if compiling.is_set():
            break
    assert compiling.is_set() and not uploader.poll(0)
    theirs = request(control_server, other, c.Launch("echo", []), 1).instance_id
    assert isinstance(request(control_server, other, c.SendMessage(theirs, "hi"), 2), c.Ok)
    turn_until(control_server, other, lambda: messages(control_server.loop, theirs) == ["echo: hi"])
    while other.poll(0):  # the replies to its heartbeats
        assert isinstance(c.CODEC.decode(other.recv()).message, c.Alive)
    reply = request(control_server, other, upload_chunk(fresh_program("hello-rust"), "another"), 3)
    assert (reply.code, reply.message) == (  # in-process peers are all the operator: one client
        "upload_busy", "a program of this client is compiling; upload the next once it is stored")
    clock.offset_s += control_server.loop.config.lease_s + 1
    turn(control_server)
    assert control_server.loop.record(kept) is not None  # waiting for the server is not silence
    assert control_server.loop.ended(theirs).error == "its client went away (lease expired)"  # silence is
    release.set()
    reply = next_reply(control_server, uploader)
    assert reply == c.UploadReply(hashlib.sha256(wasm).hexdigest(), len(wasm), True) and programs.has(reply.sha256)
    assert isinstance(request(control_server, uploader, c.Launch(reply.sha256, []), 3), c.Launched)
    for dealer in (uploader, other):
        dealer.close(0)


def test_uploads_of_a_program_that_is_compiling_share_its_compile(control_server, monkeypatch):
    """A second upload of a program whose compile is under way (a retry, or another connection) takes no
    compile slot and starts no compile of its own: it is answered, with the first, once that one compile
    is stored. A different program of the same client is still ``upload_busy`` meanwhile."""
    programs = control_server.loop.programs
    compiling, release, compiles = threading.Event(), threading.Event(), []
    compile_now = programs.compile

    def held_compile(wasm: bytes):
        compiles.append(hashlib.sha256(wasm).hexdigest())
        compiling.set()
        assert release.wait(120)
        return compile_now(wasm)
    monkeypatch.setattr(programs, "compile", held_compile)
    wasm, other_wasm = fresh_program("hello-rust"), fresh_program("hello-rust")
    first, again, third = (dealer_at(control_server.endpoint, name) for name in (b"first", b"again", b"third"))
    first.send(c.CODEC.encode(upload_chunk(wasm, "hello-first"), 1))
    turn_until(control_server, first, compiling.is_set)
    again.send(c.CODEC.encode(upload_chunk(wasm, "hello-again"), 1))
    reply = request(control_server, third, upload_chunk(other_wasm, "hello-other"), 1)
    assert reply.code == "upload_busy"  # (in-process peers are all the operator: one client)
    for dealer in (first, again):  # nothing but the answers to heartbeats yet
        while dealer.poll(0):
            assert isinstance(c.CODEC.decode(dealer.recv()).message, c.Alive)
    release.set()
    expected = c.UploadReply(hashlib.sha256(wasm).hexdigest(), len(wasm), True)
    assert [next_reply(control_server, dealer) for dealer in (first, again)] == [expected, expected]
    assert compiles == [expected.sha256]
    assert programs.resolve("hello-first", OPERATOR) == programs.resolve("hello-again", OPERATOR) == expected.sha256
    third.send(c.CODEC.encode(upload_chunk(other_wasm, "hello-other"), 2))  # a compile slot is free again
    reply = next_reply(control_server, third)
    assert reply == c.UploadReply(hashlib.sha256(other_wasm).hexdigest(), len(other_wasm), True)
    assert compiles == [expected.sha256, reply.sha256]
    for dealer in (first, again, third):
        dealer.close(0)


def test_a_launch_that_must_compile_again_stalls_nothing(control_server, monkeypatch):
    """A stored program whose code is not in memory and whose compiled file is unusable (as after a
    wasmtime upgrade) is compiled again on a loader thread when launched (held here until the test lets
    it go): meanwhile the server serves other clients and launches other programs, and two launches of it
    share one load. Both are answered once it is loaded; its compiled file is written again, and a later
    launch starts at once."""
    programs = control_server.loop.programs
    digest = programs.add(fresh_program("hello-rust"), "stale-hello")  # (held: how long it compiles is moot)
    programs._components.pop(digest)  # a restarted server holds no code in memory
    programs._compiled_path(digest).write_bytes(b"compiled by some other wasmtime")
    loading, release, loads = threading.Event(), threading.Event(), []
    load_now = programs.load

    def held_load(digest_: str):
        if digest_ == digest:
            loads.append(digest_)
            loading.set()
            assert release.wait(120)
        return load_now(digest_)
    monkeypatch.setattr(programs, "load", held_load)
    first, second, other = (dealer_at(control_server.endpoint, name) for name in (b"first", b"second", b"other"))
    first.send(c.CODEC.encode(c.Launch("stale-hello", []), 1))
    second.send(c.CODEC.encode(c.Launch(digest, []), 1))
    turn_until(control_server, first, loading.is_set)
    theirs = request(control_server, other, c.Launch("echo", []), 1).instance_id
    assert isinstance(request(control_server, other, c.SendMessage(theirs, "hi"), 2), c.Ok)
    turn_until(control_server, other, lambda: messages(control_server.loop, theirs) == ["echo: hi"])
    assert loads == [digest] and not first.poll(0) and not second.poll(0)
    release.set()
    launched = [next_reply(control_server, dealer) for dealer in (first, second)]  # after a compile: seconds
    assert all(isinstance(reply, c.Launched) for reply in launched) and loads == [digest]
    assert {control_server.loop.record(reply.instance_id).program for reply in launched} == {digest}
    assert programs._read_compiled(digest) is not None  # written again, by this store
    again = request(control_server, other, c.Launch(digest, []), 3)
    assert isinstance(again, c.Launched) and loads == [digest]  # in memory now: no load, answered at once
    for dealer in (first, second, other):
        dealer.close(0)

"""The control server's requests about programs: chunked uploads and the list.

A new program is compiled on a worker thread (seconds for a Python inferlet), so a client's upload
never stalls the inferlets the control loop runs; its last chunk is answered (``LATER``) once the
program is stored. Every buffer has a cap (``upload_busy`` past it): half-finished uploads per client
and in all, and programs compiling or waiting to, one per client and MAX_COMPILING in all; uploads of a
program that is compiling already wait for that compile rather than start another. A launch of
a stored program whose code is not in memory (the server restarted, or wasmtime changed and its
compiled file must be compiled again) is answered once a loader thread has loaded it.
"""

from __future__ import annotations

import hashlib
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Callable

from oven.proto import control as c

from .requests import LATER, Caller, RequestFailed
from .runtime.programs import DIGEST, LIBRARY, ProgramError

MAX_UPLOAD_BYTES = 256 << 20  # one program; also what one client may have half uploaded at once
MAX_BUFFERED_UPLOAD_BYTES = 1 << 30  # partial uploads of all clients together
MAX_COMPILING = 4  # programs compiling or waiting to, of all clients together (each client: one)


class ProgramRequests:
    """Part of ``ControlServer`` (it supplies ``loop`` and ``_reply_later``)."""

    def _init_programs(self) -> None:
        # (route, client name, sha256) -> bytes so far: a connection's, counted against its client
        self._uploads: dict[tuple[bytes, str, str], bytearray] = {}
        self._compiling: set[str] = set()  # clients with a program compiling (one each)
        self._compiles: dict[str, Future] = {}  # sha256 -> its compile: later uploads of it share it
        # digest -> the launches waiting for its code: (what sends the answer, what makes it)
        self._loading: dict[str, list[tuple[Callable[[object], None], Callable[[], object]]]] = {}
        self._compiler = ThreadPoolExecutor(1, thread_name_prefix="oven-compile")
        # Loads have their own threads: most map a compiled file in milliseconds, and must not queue
        # behind an upload's compile; two, so that one program compiling again holds up no other.
        self._loader = ThreadPoolExecutor(2, thread_name_prefix="oven-load")

    def _close_programs(self) -> None:
        for pool in (self._compiler, self._loader):
            pool.shutdown(wait=False, cancel_futures=True)

    def _upload(self, caller: Caller, req: c.UploadChunk):
        if not DIGEST.match(req.sha256):
            raise RequestFailed("bad_upload", "sha256 must be 64 lowercase hex digits")
        if not 0 < req.total_bytes <= MAX_UPLOAD_BYTES:
            raise RequestFailed("bad_upload", f"a program must be 1 byte to {MAX_UPLOAD_BYTES >> 20} MiB")
        if req.shared and not caller.operator:
            raise RequestFailed("forbidden", "only the operator may publish to the shared library")
        namespace = LIBRARY if req.shared else caller.name
        programs = self.loop.programs

        def recorded(size: int) -> c.UploadReply:  # the program is stored: the caller may run it, by its name
            programs.record_upload(req.sha256, req.name or None, uploader=caller.name, namespace=namespace)
            return c.UploadReply(req.sha256, size, True)
        try:
            programs.check_name_room(namespace, req.name or None)  # before the bytes, not after a compile
            if programs.has(req.sha256) and req.offset + len(req.data) == req.total_bytes == len(req.data):
                # Stored already, and this one chunk is the whole program: it proves the caller has the bytes.
                if hashlib.sha256(req.data).hexdigest() != req.sha256:
                    raise RequestFailed("bad_upload", "the uploaded bytes do not match their SHA-256")
                return recorded(req.total_bytes)
            if req.offset == 0 and not programs.has(req.sha256):
                try:
                    programs.check_room_for(caller.name, req.total_bytes)
                except ProgramError as exc:
                    raise RequestFailed("program_quota", str(exc)) from None
            if req.offset + len(req.data) == req.total_bytes and req.sha256 not in self._compiles:
                self._check_compile_slot(caller)  # refused before the last chunk is taken: only it is resent
            data = self._buffer_chunk(caller, req)
            if data is None:
                return c.UploadReply(req.sha256, len(self._uploads[(caller.route, caller.name, req.sha256)]), False)
            if programs.has(req.sha256):  # stored while this one was uploading
                return recorded(len(data))
        except ProgramError as exc:
            raise RequestFailed("bad_program", str(exc)) from None
        return self._compile_later(caller, req, data, namespace)

    def _check_compile_slot(self, caller: Caller) -> None:
        if caller.name in self._compiling:
            raise RequestFailed("upload_busy", "a program of this client is compiling; upload the next once it is "
                                               "stored")
        if len(self._compiling) >= MAX_COMPILING:
            raise RequestFailed("upload_busy", f"{MAX_COMPILING} programs are compiling already: try again "
                                               "in a few seconds")

    def _compile_later(self, caller: Caller, req: c.UploadChunk, data: bytes, namespace: str):
        """Compile ``data`` on the worker thread, then store it and answer, on the loop thread (``_upload``
        checked the compile slot before it took the last chunk). An upload of a program that is compiling
        already (another client's, or this one's sent again) takes no slot and waits for that compile."""
        reply = self._reply_later()
        future = self._compiles.get(req.sha256)
        if future is None:
            self._compiling.add(caller.name)
            future = self._compiles[req.sha256] = self._compiler.submit(self.loop.programs.compile, data)

            def finished(_done: Future) -> None:  # on the loop thread, before the uploaders' answers
                self._compiling.discard(caller.name)
                del self._compiles[req.sha256]
            future.add_done_callback(lambda done: self.loop.post(lambda: finished(done)))

        def store(compiled: Future) -> None:  # on the loop thread
            try:
                digest = self.loop.programs.add_compiled(compiled.result(), req.name or None, uploader=caller.name,
                                                         namespace=namespace)
            except ProgramError as exc:
                reply(c.ControlError("bad_program", str(exc)))
            except Exception as exc:  # a compiler's failure is the uploader's answer, not the server's end
                reply(c.ControlError("internal", f"{type(exc).__name__}: {exc}"))
            else:
                reply(c.UploadReply(digest, len(data), True))

        future.add_done_callback(lambda done: self.loop.post(lambda: store(done)))
        return LATER

    def _load_later(self, digest: str, then: Callable[[], object]):
        """Load a stored program's code on a loader thread (its compiled file, or a compile of seconds
        when that file is unusable, as after a wasmtime upgrade), keep it, then answer with ``then()``
        on the loop thread. Launches of one program share one load."""
        waiter = (self._reply_later(), then)
        if digest in self._loading:
            self._loading[digest].append(waiter)
            return LATER
        self._loading[digest] = [waiter]

        def answer_all(loaded: Future) -> None:  # on the loop thread
            waiters = self._loading.pop(digest)
            try:
                self.loop.programs.keep(digest, loaded.result())
            except ProgramError as exc:  # stored, but no longer compiles
                failure = c.ControlError("unknown_program", str(exc))
            except Exception as exc:  # a compiler's failure is the launcher's answer, not the server's end
                failure = c.ControlError("internal", f"{type(exc).__name__}: {exc}")
            else:
                failure = None
            for reply, make_answer in waiters:
                reply(failure if failure is not None else self._answered("Launch", make_answer))

        future = self._loader.submit(self.loop.programs.load, digest)
        future.add_done_callback(lambda done: self.loop.post(lambda: answer_all(done)))
        return LATER

    def _buffer_chunk(self, caller: Caller, req: c.UploadChunk) -> bytes | None:
        """Add a chunk to the caller's upload; the whole program once complete and checked, else None."""
        key = (caller.route, caller.name, req.sha256)
        # per client, not per connection: one client's many connections share one program's worth
        mine = sum(len(b) for (_, name, _), b in self._uploads.items() if name == caller.name)
        if mine + len(req.data) > MAX_UPLOAD_BYTES:
            raise RequestFailed("upload_busy", f"this client has {mine / 2**20:.1f} MiB of unfinished uploads; "
                                               f"finish them first (at most {MAX_UPLOAD_BYTES >> 20} MiB at once)")
        if sum(map(len, self._uploads.values())) + len(req.data) > MAX_BUFFERED_UPLOAD_BYTES:
            raise RequestFailed("upload_busy", f"{MAX_BUFFERED_UPLOAD_BYTES >> 20} MiB of unfinished uploads are "
                                               "buffered already: try again when they finish")
        buffer = self._uploads.setdefault(key, bytearray())
        if req.offset != len(buffer) or req.offset + len(req.data) > req.total_bytes:
            self._uploads.pop(key, None)
            raise RequestFailed("bad_upload", f"chunk at offset {req.offset} does not follow {len(buffer)} bytes")
        buffer += req.data
        if len(buffer) < req.total_bytes:
            return None
        data = bytes(self._uploads.pop(key))
        if hashlib.sha256(data).hexdigest() != req.sha256:
            raise RequestFailed("bad_upload", "the uploaded bytes do not match their SHA-256")
        return data

    def _drop_uploads(self, route: bytes | None = None, client: str | None = None) -> None:
        """Forget the unfinished uploads of a connection that went, or of a client removed: nobody will
        finish them."""
        for key in [key for key in self._uploads if key[0] == route or key[1] == client]:
            del self._uploads[key]

    def _remove_program(self, caller: Caller, req: c.RemoveProgram) -> c.Ok:
        programs = self.loop.programs
        try:
            digest = programs.resolve(req.program, caller.name)
        except ProgramError as exc:
            raise RequestFailed("unknown_program", str(exc)) from None
        if not caller.operator and not programs.holds(digest, caller.name):
            raise RequestFailed("forbidden", f"{req.program!r} is the shared library's: only the operator may "
                                             "remove it")
        programs.remove(digest, caller.name)
        return c.Ok()

    def _list_programs(self, caller: Caller, _req) -> c.ProgramList:
        return c.ProgramList([c.ProgramEntry(h, names, size) for h, names, size in self.loop.programs.entries(caller.name)])

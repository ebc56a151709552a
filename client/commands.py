"""The client verbs of the ``oven`` CLI: serve, run, asynclm, upload, ps, kill, send."""

from __future__ import annotations

import argparse
import os
import queue
import shutil
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

from oven.inference.config import InferenceConfig
from oven.proto.config_loader import config_from_args

from oven.control.config import ControlConfig
from oven.control.inference_process import terminate
from oven.proto.auth import AuthError
from oven.proto.endpoints import ipc_path, private_endpoint
from oven.proto.lifeline import lifeline_env

from .rpc import ControlRequestError, OvenClient, ServerRestarted

INFERLETS_DIR = Path(__file__).resolve().parent.parent / "inferlets"
EXIT_FAILURE, EXIT_USAGE = 1, 2


def resolve_program(program: str) -> tuple[Path, str]:
    """(wasm path, name) for an inferlet name in inferlets/ or a path to a .wasm file."""
    path = Path(program)
    if path.suffix == ".wasm":
        if not path.is_file():
            raise FileNotFoundError(f"{program}: no such file")
        return path, path.stem
    built = INFERLETS_DIR / program / f"{program}.wasm"
    if built.is_file():
        return built, program
    if (INFERLETS_DIR / program).is_dir():
        raise FileNotFoundError(f"inferlet {program!r} is not built yet: run `oven build inferlets/{program}` "
                                "(setup.sh builds them all)")
    known = sorted(d.name for d in INFERLETS_DIR.iterdir() if d.is_dir()) if INFERLETS_DIR.is_dir() else []
    raise FileNotFoundError(f"{program!r} is neither a .wasm file nor an inferlet ({', '.join(known) or 'none'})")


def cmd_serve(args: argparse.Namespace) -> int:
    import logging

    from oven.control.serve import serve

    logging.basicConfig(level=logging.WARNING, format="%(asctime)s control %(levelname)s %(message)s")
    try:
        inference = config_from_args(InferenceConfig, args)
        control = config_from_args(ControlConfig, args, section="control")
    except ValueError as exc:
        print(f"oven: {exc}", file=sys.stderr)
        return 2
    return serve(inference, control, verbose=not args.quiet)


class EmbeddedServer:
    """A private ``oven serve`` for one ``oven run``, stopped when the run ends (or dies with it)."""

    def __init__(self, model: str):
        self.endpoint = private_endpoint()
        cmd = [sys.executable, "-m", "oven.client.cli", "serve", "--model", model, "--quiet",
               "--control-endpoint", self.endpoint]
        self.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                     env={**os.environ, **lifeline_env()})

    def wait_ready(self, client: OvenClient, timeout_s: float = 300.0) -> None:
        deadline = time.monotonic() + timeout_s
        while not client.reachable(timeout_s=1.0):
            if self.proc.poll() is not None:
                raise RuntimeError(f"the embedded server exited with status {self.proc.returncode}")
            if time.monotonic() > deadline:
                raise TimeoutError("the embedded server did not come up")

    def stop(self) -> None:
        terminate(self.proc, 30)
        shutil.rmtree(ipc_path(self.endpoint).parent, ignore_errors=True)


def _resolved(program: str) -> tuple[Path, str] | None:
    """``resolve_program``, or None once the reason is printed (the verb then exits with EXIT_USAGE)."""
    try:
        return resolve_program(program)
    except FileNotFoundError as exc:
        print(f"oven: {exc}", file=sys.stderr)
        return None


@contextmanager
def connected(endpoint: str | None, model: str, token: str | None = None):
    """A client of the server at ``endpoint`` (default: this user's), or of an embedded one started
    (and stopped) here when none answers."""
    client, embedded = OvenClient(endpoint, token=token), None
    try:
        if not client.reachable():
            client.close()
            print("oven: no server answers; starting an embedded one ...", file=sys.stderr, flush=True)
            embedded = EmbeddedServer(model)
            client = OvenClient(embedded.endpoint)
            embedded.wait_ready(client)
        yield client
    finally:
        client.close()
        if embedded:
            embedded.stop()


def cmd_run(args: argparse.Namespace) -> int:
    if (found := _resolved(args.program)) is None:
        return EXIT_USAGE
    path, name = found
    instance_id = None
    try:
        with connected(args.server, args.model, args.token) as client:
            try:
                instance_id = client.launch(client.upload_file(path, name), args.args, detach=args.detach)
                if args.detach:
                    print(instance_id)
                    return 0
                return stream(client, instance_id)
            except KeyboardInterrupt:
                if instance_id:
                    client.terminate(instance_id)
                raise
    except (ControlRequestError, RuntimeError, TimeoutError, AuthError) as exc:
        print(f"oven: {exc}", file=sys.stderr)
        return EXIT_FAILURE


def cmd_asynclm(args: argparse.Namespace) -> int:
    from .asynclm.session import (StreamPrinter, bfcl_workload, demo_workload, read_user_interrupts, run_session,
                          session_spec, summary_lines)

    try:
        path, name = resolve_program("asynclm")
        if args.tools == "demo":
            workload = demo_workload(args.task, plan=not args.no_plan)
        else:
            workload = bfcl_workload(args.tools.split(":", 1)[1], args.sample)
            if args.task:
                workload.task = args.task
            if args.no_plan:
                workload.plan = None
    except (FileNotFoundError, ValueError, IndexError) as exc:
        print(f"oven: {exc}", file=sys.stderr)
        return 2
    spec = session_spec(workload, args.mode, stateless=args.stateless or None, kv=args.kv,
                        max_tokens=args.max_tokens, answer_tokens=args.answer_tokens)
    print(f"task: {workload.task}", flush=True)
    outgoing = queue.Queue()
    if sys.stdin.isatty():
        read_user_interrupts(outgoing)
        print("(type a line and press Enter to interrupt the model with it)", file=sys.stderr)
    try:
        with connected(args.server, args.model, args.token) as client:
            session = run_session(client, client.upload_file(path, name), workload, spec, StreamPrinter(),
                                  results=outgoing)
            print(flush=True)  # end the streamed text before an embedded server says it is shutting down
    except (ControlRequestError, RuntimeError, TimeoutError, AuthError) as exc:
        print(f"oven: {exc}", file=sys.stderr)
        return EXIT_FAILURE
    if session.exit_code != 0:
        print(f"oven: asynclm failed: {session.error}", file=sys.stderr)
        return session.exit_code or EXIT_FAILURE
    print("\n--- " + "\n    ".join(summary_lines(session.summary)))
    if not session.summary.get("calls"):
        print("oven: the model made no calls (a 135M model rarely writes CML unprompted; without a TASK "
              "the demo pins its calls)", file=sys.stderr)
    return 0


def stream(client: OvenClient, instance_id: str) -> int:
    """Print an instance's output until it exits; return its exit code."""
    for event in client.events():
        if event is None or event.instance_id != instance_id:
            continue
        if event.kind == "stdout":
            sys.stdout.write(event.text)
            sys.stdout.flush()
        elif event.kind == "stderr":
            sys.stderr.write(event.text)
            sys.stderr.flush()
        elif event.kind == "message":
            print(event.text, flush=True)
        elif event.kind == "exit":
            if event.text:
                print(f"oven: {instance_id} failed: {event.text}", file=sys.stderr)
            return event.exit_code if event.exit_code is not None else EXIT_FAILURE
    return EXIT_FAILURE


def _with_client(args: argparse.Namespace, action) -> int:
    with OvenClient(args.server, timeout_s=30, token=args.token) as client:
        try:
            client.info(timeout_s=2.0)  # a server that is not there is said at once, not after 30 s
            return action(client) or 0
        except TimeoutError:
            print(f"oven: no server answers at {client.endpoint} (start one with `oven serve`)", file=sys.stderr)
        except (ControlRequestError, AuthError, ServerRestarted) as exc:
            print(f"oven: {exc}", file=sys.stderr)
        return EXIT_FAILURE


def cmd_upload(args: argparse.Namespace) -> int:
    if (found := _resolved(args.program)) is None:
        return EXIT_USAGE
    path, name = found
    return _with_client(args, lambda client: print(client.upload_file(path, args.name or name, args.shared)))


def cmd_ps(args: argparse.Namespace) -> int:
    def show(client: OvenClient) -> None:
        if args.programs:
            for entry in client.programs():
                print(f"{entry.sha256[:16]}  {entry.size_bytes / 1e6:7.1f} MB  {', '.join(entry.names)}")
            return
        print(f"{'INSTANCE':20} {'PROGRAM':14} {'OWNER':10} {'STATE':9} {'AGE':>8}  EXIT")
        for i in client.instances():
            exit_text = "" if i.exit_code is None else str(i.exit_code)
            print(f"{i.instance_id:20} {i.program:14} {i.owner:10} {i.state:9} {i.age_s:7.1f}s  {exit_text} {i.error}")
    return _with_client(args, show)


def cmd_exports(args: argparse.Namespace) -> int:
    def act(client: OvenClient) -> None:
        for name in args.drop:
            client.drop_export(name, args.owner)
            print(f"dropped {name}")
        if args.drop:
            return
        print(f"{'EXPORT':32} {'PAGES':>6}  {'EXPORTER':20} {'OWNER':10} EXPORTER STATE")
        for e in client.exports():
            print(f"{e.name:32} {e.num_pages:6d}  {e.exporter:20} {e.owner:10} "
                  f"{'running' if e.exporter_running else 'ended'}")
    return _with_client(args, act)


def cmd_kill(args: argparse.Namespace) -> int:
    return _with_client(args, lambda client: client.terminate(args.instance_id))


def cmd_send(args: argparse.Namespace) -> int:
    return _with_client(args, lambda client: client.send(args.instance_id, args.text))


def cmd_token(args: argparse.Namespace) -> int:
    def act(client: OvenClient) -> None:
        if args.action == "add":
            print(client.add_client(args.name))
        elif args.action == "remove":
            client.remove_client(args.name)
            print(f"removed {args.name}")
        else:
            print("\n".join(client.clients()))
    if args.action in ("add", "remove") and not args.name:
        print(f"oven token {args.action}: NAME is required", file=sys.stderr)
        return EXIT_USAGE
    return _with_client(args, act)

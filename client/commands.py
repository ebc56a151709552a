"""The client verbs of the ``oven`` CLI: serve, run, attach, asynclm, upload, ps, exports, kill, send, token,
adapters.

Each verb ends with one line on stderr for what went wrong (``oven: ...``) and a status: 1 for a
failure, 2 for a usage error; it never shows a traceback for ordinary mistakes.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import queue
import sys
from collections.abc import Callable

from oven.control.config import ControlConfig
from oven.inference.config import InferenceConfig
from oven.proto import control as c
from oven.proto.auth import AuthError
from oven.proto.config_loader import config_from_args
from oven.proto.endpoints import listening

from .connect import EXIT_FAILURE, EXIT_USAGE, NoServer, client_of, connected, target_of
from .json_output import print_json
from .programs import LocalProgram, ProgramNotFound, library_program, local_program, not_found, upload_local
from .rpc import ControlRequestError, OvenClient, ServerRestarted

KILLED_STATUS = 143  # the exit status the server gives an instance a client or a lapsed lease terminated
FAILURES = (ControlRequestError, AuthError, NoServer, ServerRestarted, RuntimeError, TimeoutError)


def say(message: str) -> None:
    print(f"oven: {message}", file=sys.stderr, flush=True)


def cmd_serve(args: argparse.Namespace) -> int:
    import logging

    from oven.control.serve import serve

    from .openai_api.frontend import FrontEnd, FrontEndError, OpenAIConfig

    logging.basicConfig(level=logging.WARNING, format="%(asctime)s control %(levelname)s %(message)s")
    # The loop logs the interception policy's cost profile as it learns it, and a summary at shutdown
    # (not for an embedded server, started --quiet, whose output is its client's).
    if not args.quiet:
        logging.getLogger("oven.control.runtime.loop").setLevel(logging.INFO)
    try:
        inference = config_from_args(InferenceConfig, args)
        control = config_from_args(ControlConfig, args, section="control")
        api = config_from_args(OpenAIConfig, args, section="openai")
        front = FrontEnd(api, library_program("chat-completion").path) if api.openai_port else None
        if front is not None:
            front.bind()  # before the model loads: an address in use fails at once
    except (ValueError, ProgramNotFound, FrontEndError) as exc:
        say(str(exc))
        return EXIT_USAGE if isinstance(exc, ValueError) else EXIT_FAILURE

    def start_api(endpoint: str) -> None:  # the control server serves: the API's requests can go through
        front.start(endpoint, (control.state_path / "operator.token").read_text().strip())

    try:
        return serve(inference, control, verbose=not args.quiet, on_ready=start_api if front else None)
    finally:
        if front is not None:
            front.stop()


def _verb(action: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
    """Run a client verb: its known failures become one ``oven: ...`` line and status 1."""
    def run(args: argparse.Namespace) -> int:
        try:
            return action(args)
        except FAILURES as exc:  # before ValueError: an AuthError is one
            say(str(exc))
            return EXIT_FAILURE
        except (ValueError, ProgramNotFound) as exc:  # a bad setting (environment, config file), a bad name
            say(str(exc))
            return EXIT_USAGE
    run.__doc__ = action.__doc__
    return run


PYTHON_SIZED = 4 << 20  # bytes: a component this large carries an interpreter, and compiles for seconds


def compile_notice(name: str, size_bytes: int) -> None:
    """Said before uploading a program the server lacks: it compiles it (seconds, once per program)."""
    # (compile time follows size: a Python component carries its interpreter, 18-20 MB; a Rust one ~100 kB)
    took = "about 15 s for a Python inferlet" if size_bytes > PYTHON_SIZED else "a second or so"
    say(f"uploading {name}; the server compiles it once ({took}) ...")


def upload(client: OvenClient, program: LocalProgram, name: str, shared: bool = False) -> str:
    """Upload ``program``; say so first when the server will compile it."""
    return upload_local(client, program, name, shared, on_upload=compile_notice)


@_verb
def cmd_run(args: argparse.Namespace) -> int:
    local = local_program(args.program)  # a bad path is said before a server is reached (or started)
    target = target_of(args)
    if args.detach and not listening(target.endpoint):  # an embedded server would end, and the instance with it
        raise NoServer(f"--detach needs a server that outlives this command: {target.no_server()}")
    with connected(target, args.model) as client:
        try:  # the library's resolution: a local program is uploaded, a name is the server's
            instance_id = client.launch(args.program, args.args, detach=args.detach, on_upload=compile_notice)
        except ControlRequestError as exc:
            if exc.code == "unknown_program" and local is None:
                raise not_found(args.program, [n for p in client.programs() for n in p.names]) from None
            raise
        if args.detach:
            print(instance_id)
            return 0
        with client.ending_with_caller(instance_id):
            return stream(client, instance_id)


@_verb
def cmd_attach(args: argparse.Namespace) -> int:
    with client_of(target_of(args)) as client:
        client.attach(args.instance_id)
        try:
            return stream(client, args.instance_id)
        except KeyboardInterrupt:
            say(f"detached from {args.instance_id}; it goes on (`oven kill {args.instance_id}` stops it)")
            return 130


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
            if event.text:  # 143 (128 + SIGTERM): ended from outside (a client, a lease), not by its own fault
                say(f"{instance_id} {'was killed' if event.exit_code == KILLED_STATUS else 'failed'}: {event.text}")
            return event.exit_code if event.exit_code is not None else EXIT_FAILURE
    return EXIT_FAILURE


@_verb
def cmd_asynclm(args: argparse.Namespace) -> int:
    from .asynclm.session import StreamPrinter, read_user_interrupts, run_session, session_spec, summary_lines

    program = library_program("asynclm")
    try:
        workload = _workload(args)
    except (FileNotFoundError, ValueError) as exc:
        say(str(exc))
        return EXIT_USAGE
    if args.list_tools:  # (no server needed)
        from .asynclm.tools.listing import tool_lines, tools_document
        with workload:
            if args.json:
                print_json(tools_document(workload.registry))
            else:
                print("\n".join(tool_lines(workload.registry)))
        return 0
    adapter = None if args.no_adapter else args.adapter
    # The adapter was trained on the bare prompt; the base model gets a worked example (few-shot) instead.
    spec = session_spec(workload, args.mode, args.constrain, stateless=args.stateless or None, kv=args.kv,
                        max_tokens=args.max_tokens, answer_tokens=args.answer_tokens, adapter=adapter,
                        example=None if adapter else True)
    calls = "the calls are pinned (--plan)" if workload.plan else "the model writes its calls"
    model = (f"adapter {adapter}" if adapter else "the base model (--no-adapter)") \
        + ("; calls held to the tools' schemas (--constrain)" if args.constrain else "")
    print(f"task: {workload.task}\n({calls}; {model})", flush=True)
    outgoing = queue.Queue()
    if sys.stdin.isatty():
        read_user_interrupts(outgoing)
        print("(type a line and press Enter to interrupt the model with it)", file=sys.stderr)
    with workload, connected(target_of(args), args.model) as client:  # (workload: MCP sessions it holds open)
        session = run_session(client, upload(client, program, program.name), workload, spec, StreamPrinter(),
                              results=outgoing)
        print(flush=True)  # end the streamed text before an embedded server says it is shutting down
    if session.exit_code != 0:
        hint = " (--no-adapter runs the base model)" if adapter and "adapter" in session.error else ""
        say(f"asynclm failed: {session.error}{hint}")
        return session.exit_code or EXIT_FAILURE
    print("\n--- " + "\n    ".join(summary_lines(session.summary)))
    if not session.summary.get("calls"):
        say("the model made no calls" + ("" if adapter else " (the base 135M model rarely writes CML; the default "
                                                             "adapter was fine-tuned to)"))
    return 0


def _workload(args: argparse.Namespace):
    """The workload ``--tools`` and ``--sample`` name; a ValueError says which forms and samples there are."""
    from .asynclm.session import bfcl_workload, demo_workload, tools_workload
    from .asynclm.tools.bfcl import KINDS, load_scenarios
    from .asynclm.tools.sources import is_user_source, unknown_source

    if args.task is not None and not args.task.strip():  # (a TASK left out runs the demo's own)
        raise ValueError("TASK is empty: give a task, or leave it out for the demo's")
    if args.json and not args.list_tools:
        raise ValueError("--json goes with --list-tools (a run prints its stream)")
    specs = args.tools or ["demo"]
    if specs == ["demo"]:
        return demo_workload(args.task, plan=args.plan)
    if not any(spec == "demo" or spec.startswith("bfcl:") for spec in specs):  # a user's files and MCP servers
        if not all(map(is_user_source, specs)):
            raise unknown_source(next(spec for spec in specs if not is_user_source(spec)))
        if args.plan:
            raise ValueError("--plan pins the demo task's or a BFCL sample's calls; your own tools have none")
        if args.task is None and not args.list_tools:
            raise ValueError("give a TASK for your own tools (the demo task needs the demo tools)")
        return tools_workload(specs, args.task)
    if len(specs) > 1:
        raise ValueError(f"--tools {' --tools '.join(specs)}: demo and bfcl:KIND bring their own tools: give them "
                         "alone")
    kind = specs[0].removeprefix("bfcl:")
    if kind not in KINDS:
        raise unknown_source(specs[0])
    workload = None
    if args.sample >= 0:
        with contextlib.suppress(IndexError):  # past the last one (only then are all loaded, to say how many)
            workload = bfcl_workload(kind, args.sample)
    if workload is None:
        raise ValueError(f"--sample {args.sample}: bfcl:{kind} has samples 0 to {len(load_scenarios(kind)) - 1}")
    if args.task:
        workload.task = args.task
    if not args.plan:
        workload.plan = None
    return workload


def _with_client(action: Callable[[argparse.Namespace, OvenClient], None]) -> Callable[[argparse.Namespace], int]:
    """A verb that needs a running server (none answering is said at once)."""
    @_verb
    def run(args: argparse.Namespace) -> int:
        with client_of(target_of(args)) as client:
            return action(args, client) or 0
    return run


@_verb
def cmd_upload(args: argparse.Namespace) -> int:
    local = local_program(args.program)  # a bad path is said before the server is asked anything
    if local is None:
        raise not_found(args.program, [])
    with client_of(target_of(args)) as client:
        print(upload(client, local, args.name or local.name, args.shared))
    return 0


def cmd_ps(args: argparse.Namespace) -> int:
    mistake = ("--drop forgets programs: give it with --programs" if args.drop and not args.programs else
               "--json lists: give it without --drop" if args.drop and args.json else "")
    if mistake:  # said before a server is asked
        say(mistake)
        return EXIT_USAGE
    return _ps(args)


@_with_client
def _ps(args: argparse.Namespace, client: OvenClient) -> None:
    if args.drop:
        for program in args.drop:
            client.remove_program(program)
            print(f"dropped {program}")
        return
    if args.programs:
        if args.json:
            return print_json(c.ProgramList(client.programs()))
        for entry in client.programs():
            print(f"{entry.sha256[:16]}  {entry.size_bytes / 1e6:7.1f} MB  {', '.join(entry.names)}")
        return
    if args.json:
        return print_json(c.InstanceList(client.instances()))
    instances = client.instances()
    # A PARENT column only when an inferlet launched some of them (WIT children): "-" for a client's launch.
    with_parent = any(i.parent for i in instances)
    parent_title = f"{'PARENT':20} " if with_parent else ""
    print(f"{'INSTANCE':20} {'PROGRAM':20} {'OWNER':10} {parent_title}{'STATE':9} {'AGE':>8} {'CPU':>8} "
          f"{'REPLICA':>7}  EXIT")
    for i in instances:
        exit_text = "" if i.exit_code is None else str(i.exit_code)
        parent = f"{i.parent or '-':20} " if with_parent else ""
        print(f"{i.instance_id:20} {i.program:20} {i.owner:10} {parent}{i.state:9} {i.age_s:7.1f}s {i.cpu_s:7.2f}s "
              f"{i.replica:7d}  {exit_text:4} {i.error}".rstrip())


@_with_client
def cmd_server_info(args: argparse.Namespace, client: OvenClient) -> None:
    """``oven info`` of a running ``oven serve``: its ServerInfo, with its replicas and adapters."""
    info, stats = client.info(), client.stats()
    shown = {**dataclasses.asdict(info), "interception_policy": stats.interception_policy,
             "replicas": stats.replicas, "adapters": client.adapters()}
    if args.json:
        return print_json(shown)
    shown["replicas"] = ", ".join(f"{r.index} {'serving' if r.serving else 'restarting'}" for r in stats.replicas)
    shown["adapters"] = ", ".join(f"{a.name} ({a.state}, id {a.adapter_id})" for a in shown["adapters"]) or "none"
    for key in ("models", "traits"):
        shown[key] = ", ".join(shown[key])
    width = max(map(len, shown))
    for key, value in {"server": client.endpoint, **shown}.items():
        print(f"{key:{width}} {value}")


@_with_client
def cmd_stats(args: argparse.Namespace, client: OvenClient) -> None:
    s = client.stats()
    if args.json:
        return print_json(s)
    print(f"batches {s.num_batches}, commands {s.num_commands} ({s.mean_batch_size:.1f} per batch); free: "
          f"{s.free_kv_pages} KvPages, {s.free_embeds} embeds, {s.free_host_slots} host slots")
    print(f"device {s.device_s:.1f} s, of it recomputing discarded K/V {s.rewrite_s:.1f} s (its batches held "
          f"{s.rewrite_page_s:.0f} page-s meanwhile); intercepted instances kept {s.intercepted_page_s:.0f} page-s "
          f"on the device, {s.contended_page_s:.0f} of them while memory was short; copying pages to and from "
          f"the host took {s.copy_s:.1f} s ({s.copy_page_s:.0f} page-s of running contexts waited)")
    print(f"interception policy {s.interception_policy}: {s.num_swapped_out} swapped out, {s.num_swapped_in} "
          f"back in ahead of their return, {s.num_discarded} discarded; {s.num_preempted} preempted for the pool")
    if s.profile is not None:
        print(f"profile: {s.profile.describe()}")
    if len(s.replicas) > 1:
        for r in s.replicas:
            mean = r.num_commands / r.num_batches if r.num_batches else 0.0
            print(f"replica {r.index}: {'serving' if r.serving else 'restarting'}, {r.num_instances} instances, "
                  f"{r.free_kv_pages} free KvPages, {r.num_batches} batches ({mean:.1f} commands per batch)")


def cmd_exports(args: argparse.Namespace) -> int:
    if args.drop and args.json:
        say("--json lists the exports: give it without --drop")
        return EXIT_USAGE
    return _exports(args)


@_with_client
def _exports(args: argparse.Namespace, client: OvenClient) -> None:
    for name in args.drop:
        client.drop_export(name, args.owner)
        print(f"dropped {name}")
    if args.drop:
        return
    if args.json:
        return print_json(c.ExportList(client.exports()))
    print(f"{'EXPORT':32} {'PAGES':>6}  {'EXPORTER':20} {'OWNER':10} EXPORTER STATE")
    for e in client.exports():
        print(f"{e.name:32} {e.num_pages:6d}  {e.exporter:20} {e.owner:10} {'running' if e.exporter_running else 'ended'}")


@_with_client
def cmd_kill(args: argparse.Namespace, client: OvenClient) -> None:
    client.terminate(args.instance_id)
    print(f"killed {args.instance_id}")


@_with_client
def cmd_send(args: argparse.Namespace, client: OvenClient) -> None:
    client.send(args.instance_id, args.text)
    print(f"sent {len(args.text.encode())} bytes to {args.instance_id}")


@_verb
def cmd_adapters(args: argparse.Namespace) -> int:
    from .adapters import adapters_verb
    return adapters_verb(args)


def cmd_token(args: argparse.Namespace) -> int:
    if args.action in ("add", "remove") and not args.name:
        print(f"oven token {args.action}: NAME is required", file=sys.stderr)
        return EXIT_USAGE
    if args.json and args.action == "remove":
        print("oven token remove: --json goes with list and add", file=sys.stderr)
        return EXIT_USAGE
    return _token(args)


@_with_client
def _token(args: argparse.Namespace, client: OvenClient) -> None:
    if args.action == "add":
        token = client.add_client(args.name)
        if args.json:
            return print_json(c.ClientToken(args.name, token))
        print(token)
    elif args.action == "remove":
        client.remove_client(args.name)
        print(f"removed {args.name}")
    elif args.json:
        print_json(c.ClientList(client.clients()))
    else:
        print("\n".join(client.clients()))

"""The ``oven`` command line.

* ``oven serve`` - the inference and control processes, until Ctrl-C or SIGTERM;
* ``oven run PROGRAM [-- ARGS]`` - upload if needed, launch, stream output, exit with its status;
  starts an embedded server when none answers;
* ``oven attach ID`` (``oven logs ID``) - an instance's output from its start, until it exits;
* ``oven upload`` / ``oven ps`` / ``oven kill`` / ``oven send`` - the other client verbs;
* ``oven generate PROMPT`` - greedy chat completion straight over the inference protocol;
* ``oven inference`` - run an inference process alone, in the foreground;
* ``oven info`` - what a running server (or an inference process) serves;
* ``oven prepare-model [SPEC]`` - convert/cache a model ahead of time (setup uses it);
* ``oven build DIR...`` / ``oven new NAME`` - build an inferlet folder into NAME.wasm / start one.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import signal
import sys
import threading
from collections.abc import Callable

from oven.inference.config import DEFAULT_MODEL, InferenceConfig
from oven.proto import control as c
from oven.proto.config_loader import add_config_arguments

from . import commands
from .connect import EXIT_USAGE, add_client_args, target_of
from .json_output import add_json_flag, print_json, shape
from .openai_api.frontend import OpenAIConfig
from .rpc import malformed_endpoint
from oven.control.config import ControlConfig


def cmd_generate(args: argparse.Namespace) -> int:
    from .generate import GenerationError, greedy_generate
    from oven.control.inference_process import start_inference_process
    from oven.proto.endpoints import private_endpoint
    from oven.control.tokenizer import Tokenizer

    process = None
    if args.endpoint:
        asked = _ask_inference(args.endpoint, args.timeout)
        if isinstance(asked, int):
            return asked
        client, info = asked
    else:
        config = InferenceConfig(model=args.model, endpoint=private_endpoint(), torch_threads=args.threads,
                                 num_kv_pages=args.num_kv_pages)
        print(f"oven: starting an inference process for {args.model} ...", file=sys.stderr, flush=True)
        try:
            process = start_inference_process(config, echo_stderr=args.verbose)
        except (RuntimeError, TimeoutError) as exc:
            print(f"oven: {exc}", file=sys.stderr)
            return 1
        info, client = process.info, process.client()
    try:
        tokenizer = Tokenizer(info.tokenizer)
        if args.raw:
            prompt_ids = tokenizer.encode(args.prompt)
        else:
            messages = ([{"role": "system", "content": args.system}] if args.system else [])
            prompt_ids = tokenizer.encode_chat(messages + [{"role": "user", "content": args.prompt}])
        stream = _TextStream(tokenizer)
        result = greedy_generate(client, prompt_ids, args.max_new_tokens, tokenizer.stop_token_ids,
                                 info.page_size, info.num_kv_pages, on_token=stream.push)
        stream.finish()
        decode_s = max(result.total_s - result.time_to_first_token_s, 1e-9)
        print(f"[{info.model_name} on {info.device}/{info.attention_backend}: {result.prompt_tokens} prompt tokens, "
              f"{len(result.token_ids)} generated, first token {result.time_to_first_token_s * 1000:.0f} ms, "
              f"{(len(result.token_ids) - 1) / decode_s:.1f} tok/s, stopped by {result.stopped_by}]",
              file=sys.stderr)
        return 0
    except GenerationError as exc:
        print(f"\noven: {exc}", file=sys.stderr)
        return 1
    finally:
        client.close()
        if process:
            process.stop()


class _TextStream:
    """Print decoded text as tokens arrive, holding back incomplete UTF-8 sequences."""

    def __init__(self, tokenizer):
        self.tokenizer, self.token_ids, self.printed = tokenizer, [], ""

    def push(self, token_id: int) -> None:
        if token_id in self.tokenizer.stop_token_ids:
            return
        self.token_ids.append(token_id)
        text = self.tokenizer.decode(self.token_ids, skip_special_tokens=True)
        if text.endswith("\ufffd"):
            return
        sys.stdout.write(text[len(self.printed):])
        sys.stdout.flush()
        self.printed = text

    def finish(self) -> None:
        sys.stdout.write("\n")
        sys.stdout.flush()


def _ask_inference(endpoint: str, timeout_s: float):
    """(a client of the inference process at ``endpoint``, its info); or, said in one line, the exit
    status for a malformed endpoint or one where no inference process answers."""
    from oven.control.inference_client import InferenceClient

    try:
        with malformed_endpoint(endpoint):
            client = InferenceClient(endpoint, timeout_s=timeout_s)
    except ValueError as exc:
        _say(str(exc))
        return EXIT_USAGE
    try:
        return client, client.info()
    except TimeoutError:
        client.close()
        _say(f"no inference server answers at {endpoint}")
        return 1


def cmd_info(args: argparse.Namespace) -> int:
    """A running ``oven serve`` (its control server, found as every client verb finds it), or with
    ``--endpoint`` an inference process; with neither, this user's stand-alone ``oven inference``."""
    from oven.proto.endpoints import default_inference_endpoint, listening

    if args.endpoint is None:
        try:
            target = target_of(args)
        except ValueError as exc:
            _say(str(exc))
            return EXIT_USAGE
        if target.explicit or listening(target.endpoint) or not listening(default_inference_endpoint()):
            return commands.cmd_server_info(args)
    asked = _ask_inference(args.endpoint or default_inference_endpoint(), args.timeout)
    if isinstance(asked, int):
        return asked
    client, info = asked
    client.close()
    shown = {**dataclasses.asdict(info), "stop_token_ids": info.tokenizer.stop_token_ids}
    del shown["tokenizer"]
    if args.json:
        print_json(shown)
        return 0
    for name, value in shown.items():
        print(f"{name:18} {value}")
    return 0


def cmd_prepare_model(args: argparse.Namespace) -> int:
    import logging

    from oven.inference.models import resolve_model

    logging.basicConfig(level=logging.INFO, format="oven: %(message)s")
    try:
        cfg = resolve_model(args.model, progress=_say).config
    except (ValueError, OSError) as exc:  # an unknown spec, a file that is no GGUF, a folder that is no model
        _say(_naming(args.model, str(exc)))
        return 1
    except Exception as exc:  # transformers (converting a GGUF) fails in TypeError, ZeroDivisionError, ...
        _say(_naming(args.model, f"not a usable model ({type(exc).__name__}: {exc})"))
        return 1
    print(f"oven: {cfg.name} ready: {cfg.num_layers} layers, hidden {cfg.hidden_size}, "
          f"vocab {cfg.vocab_size}, {cfg.num_params() / 1e6:.0f}M parameters", file=sys.stderr)
    return 0


_SAY_LOCK = threading.Lock()


def _say(message: str) -> None:
    """One line on stderr, whole: print() writes the newline apart, and `oven build -j` says things from
    several threads."""
    with _SAY_LOCK:
        print(f"oven: {message}", file=sys.stderr, flush=True)


class _Version(argparse.Action):
    """``--version``: the installed distribution's version, read only when asked (importing
    importlib.metadata would add about 50 ms to every verb)."""

    def __init__(self, option_strings, dest, **kwargs):
        super().__init__(option_strings, argparse.SUPPRESS, nargs=0, default=argparse.SUPPRESS,
                         help="print oven's version and exit")

    def __call__(self, parser, namespace, values, option_string=None):
        from importlib.metadata import version

        print(f"oven {version('oven')}")
        parser.exit()


def _naming(spec: str, message: str) -> str:
    """``message`` on one line (transformers' span several), beginning with ``spec`` unless it names it."""
    line = " ".join(message.split())
    return line if spec in line else f"{spec}: {line}"


def _positive(kind: type) -> Callable[[str], int | float]:
    """An argparse type for a finite number above 0; a bad one reads ``invalid positive int value: '0'``."""
    def parse(text: str) -> int | float:
        value = kind(text)
        if not 0 < value < math.inf:  # a negative timeout would wait forever; NaN fails too
            raise ValueError(text)
        return value
    parse.__name__ = f"positive {kind.__name__}"
    return parse


positive_int, positive_float = _positive(int), _positive(float)


def cmd_build(args: argparse.Namespace) -> int:
    from concurrent.futures import ThreadPoolExecutor
    from pathlib import Path

    from .build import BuildError, build

    if args.output and len(args.dirs) > 1:
        print("oven build: -o/--output takes one DIR", file=sys.stderr)
        return EXIT_USAGE

    def build_one(folder: str) -> bool:
        try:
            built = build(Path(folder), Path(args.output) if args.output else None, force=args.force, log=_say)
            if not built and not args.quiet:
                _say(f"{folder}: up to date")
            return True
        except BuildError as exc:
            _say(f"error: {exc}")
            return False

    # Each build is a componentize-py or cargo process of its own (one core, ~400 MB): a thread waits on each.
    jobs = args.jobs or min(4, len(os.sched_getaffinity(0)))
    with ThreadPoolExecutor(min(jobs, len(args.dirs))) as pool:
        failed = [folder for folder, ok in zip(args.dirs, pool.map(build_one, args.dirs)) if not ok]
    if failed and len(args.dirs) > 1:
        print(f"oven: {len(failed)} of {len(args.dirs)} failed: {' '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


def cmd_new(args: argparse.Namespace) -> int:
    from pathlib import Path

    from .build import BuildError, new_inferlet

    try:
        folder = new_inferlet(args.lang, args.name, Path(args.dir))
    except BuildError as exc:
        print(f"oven: error: {exc}", file=sys.stderr)
        return 1
    shown = folder.relative_to(Path.cwd()) if folder.is_relative_to(Path.cwd()) else folder
    main_file = "app.py" if args.lang == "python" else "src/lib.rs"
    print(f"created {shown}/ ({args.lang}); edit {shown}/{main_file}, then\n"
          f"  oven build {shown}\n"
          f"  oven run {shown} -- \"Why is the sky blue?\"")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="oven", description="oven: a programmable LLM serving system.")
    parser.add_argument("--version", action=_Version)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    gen = sub.add_parser("generate", help="greedy chat completion, streamed",
                         description="Greedy chat completion of PROMPT, streamed to stdout; stats go to stderr.")
    gen.add_argument("prompt", metavar="PROMPT")
    gen.add_argument("--model", default=DEFAULT_MODEL, help=f"model spec (default {DEFAULT_MODEL})")
    gen.add_argument("--endpoint", help="use the inference process at this ZeroMQ endpoint instead of starting one")
    gen.add_argument("--max-new-tokens", type=positive_int, default=128, help="default 128")
    gen.add_argument("--system", help="system message (default: the chat template's own)")
    gen.add_argument("--raw", action="store_true", help="feed PROMPT as plain text, without the chat template")
    gen.add_argument("--threads", type=positive_int, default=None, help="torch threads in the inference process")
    gen.add_argument("--num-kv-pages", type=positive_int, default=None,
                     help="KV pages to allocate (default: memory budget)")
    gen.add_argument("--timeout", type=positive_float, default=600.0, help="seconds to wait for any one reply")
    gen.add_argument("-v", "--verbose", action="store_true", help="show the inference process's log")
    gen.set_defaults(func=cmd_generate)

    inf = sub.add_parser("inference", help="run an inference process in the foreground", add_help=False)
    inf.set_defaults(func=None)

    info = sub.add_parser("info", help="show what a running server serves",
                          description="What a running `oven serve` serves (its model, device, pages, policies, "
                                      "replicas, adapters), asked of its control server; with --endpoint, what an "
                                      "inference process serves. With no server running, this user's stand-alone "
                                      "`oven inference`, if one answers.")
    info.add_argument("--endpoint", default=None,
                      help="ask the inference process at this ZeroMQ endpoint instead of the control server")
    info.add_argument("--timeout", type=positive_float, default=5.0,
                      help="seconds to wait for an inference process (default 5)")
    add_json_flag(info, shape(c.ServerInfoReply) + ", interception_policy, replicas (as in stats), adapters (as in "
                  "adapters)", "with --endpoint: the fields of the inference process's InfoReply but tokenizer, "
                  "and stop_token_ids")
    add_client_args(info)
    info.set_defaults(func=cmd_info)

    serve = sub.add_parser("serve", help="run the inference and control processes",
                           usage="%(prog)s [--config FILE] [--SETTING VALUE ...] [--quiet]",
                           description="Serve inferlets: an inference process plus the control loop. "
                                       "Every setting also reads OVEN_<SETTING> and --config FILE.")
    add_config_arguments(serve, InferenceConfig)
    add_config_arguments(serve, ControlConfig)
    add_config_arguments(serve, OpenAIConfig)
    serve.add_argument("--quiet", action="store_true", help="do not echo the inference process's log nor log "
                       "the interception policy's costs")
    serve.set_defaults(func=commands.cmd_serve)

    run = sub.add_parser("run", help="run an inferlet and stream its output",
                         description="Upload PROGRAM if needed (an inferlet name from inferlets/, or a .wasm "
                                     "path, an inferlet folder, or a program uploaded to the server by name), launch "
                                     "it with ARGS, stream its output, exit with its status. Starts an embedded "
                                     "server on the default model when none answers at the default endpoint.")
    run.add_argument("program", metavar="PROGRAM")
    run.add_argument("args", nargs="*", default=[], metavar="ARGS",  # default: ARGS is optional (argparse)
                     help="arguments for the inferlet (put them after --)")
    add_client_args(run)
    run.add_argument("--model", default=DEFAULT_MODEL, help="model of an embedded server (default %(default)s)")
    run.add_argument("--detach", action="store_true", help="print the instance id and return at once")
    run.set_defaults(func=commands.cmd_run)

    attach = sub.add_parser("attach", aliases=["logs"], help="stream an instance's output, from its start",
                            description="Show what INSTANCE wrote so far (a running or recently ended instance "
                                        "of yours), then what it writes until it exits; exit with its status. "
                                        "Ctrl-C detaches and leaves it running.")
    attach.add_argument("instance_id", metavar="INSTANCE")
    add_client_args(attach)
    attach.set_defaults(func=commands.cmd_attach)

    alm = sub.add_parser("asynclm", help="asynchronous function calling (AsyncLM) with live tool calls",
                         description="Run the AsyncLM inferlet on TASK: the model writes function calls in CML, "
                                     "they run concurrently on this machine while it keeps generating, and their "
                                     "results come back as interrupts. Prints the stream live and a summary. "
                                     "Starts an embedded server on the default model when none answers.")
    alm.add_argument("task", nargs="?", metavar="TASK",
                     help="the request (default: a demo task on weather and currency tools)")
    alm.add_argument("--tools", action="append", metavar="SOURCE",
                     help="where the tools come from (default demo): demo, the demo tools; bfcl:KIND, a BFCL workload "
                          "(bfcl:parallel, bfcl:live_parallel, bfcl:multi_turn, bfcl:multi_step_parallel); FILE.py, "
                          "your own Python functions; mcp:URL, an MCP server over HTTP (streamable; SSE where the path "
                          "ends in /sse); 'mcp-stdio:COMMAND ARGS', an MCP server this command starts. Repeat the flag "
                          "to combine files and MCP servers (docs/asynclm.md, 'Your own tools')")
    alm.add_argument("--list-tools", action="store_true",
                     help="print each tool's signature, estimated time and description, and exit (no server is asked)")
    add_json_flag(alm, "--list-tools: {\"tools\": [...]}, each item with name, signature, description, latency_ms and "
                       "parameters (its arguments' JSON schema)")
    alm.add_argument("--sample", type=int, default=0, help="which BFCL sample (default %(default)s)")
    alm.add_argument("--mode", default="async", choices=["async", "async-naive", "sync", "sync-parallel"])
    alm.add_argument("--stateless", action="store_true", help="sync modes: re-prefill after every call")
    alm.add_argument("--kv", default="auto", choices=["auto", "keep", "offload", "drop"],
                     help="KV cache while waiting at a trap (default %(default)s: placed by the server's interception "
                          "policy, told the expected wait)")
    alm.add_argument("--plan", action="store_true",
                     help="pin the calls (the demo task's, or the BFCL sample's) like the paper's cheat sheet, for "
                          "latency measurements; every token is still a real decode step (default: the model writes "
                          "its own calls)")
    alm.add_argument("--adapter", default="asynclm", metavar="NAME",
                     help="the LoRA adapter to decode with (default %(default)s: fine-tuned on CML, ships with oven; "
                          "see `oven adapters`)")
    alm.add_argument("--no-adapter", action="store_true",
                     help="run the base model instead, with a worked CML example in its prompt (for comparison)")
    alm.add_argument("--constrain", action="store_true",
                     help="hold each call the model writes to the tools' schemas by a grammar: one of their names, "
                          "their argument names, the required ones, values of their types and enums")
    alm.add_argument("--max-tokens", type=int, default=256, help="tokens the model may sample (pinned ones not counted)")
    alm.add_argument("--answer-tokens", type=int, default=48, help="--plan: free tokens after the pinned calls")
    add_client_args(alm)
    alm.add_argument("--model", default=DEFAULT_MODEL, help="model of an embedded server (default %(default)s)")
    alm.set_defaults(func=commands.cmd_asynclm)

    from .asynclm.training.cli import add_parsers as add_asynclm_training_parsers
    add_asynclm_training_parsers(sub, DEFAULT_MODEL)  # asynclm-data, -train, -onpolicy, -soup

    upload = sub.add_parser("upload", help="upload a program")
    upload.add_argument("program", metavar="PROGRAM", help="a .wasm path, an inferlet folder or a library inferlet")
    upload.add_argument("--name", help="name to launch it by (default: the file's stem)")
    upload.add_argument("--shared", action="store_true",
                        help="name it in the shared library, which every client sees (operator only)")
    add_client_args(upload)
    upload.set_defaults(func=commands.cmd_upload)

    ps = sub.add_parser("ps", help="list instances (and programs with --programs)",
                        description="List your running instances and the most recently ended ones (oven serve "
                                    "--finished-instances): finished, failed (a trap or an exception) or killed.")
    ps.add_argument("--programs", action="store_true", help="list uploaded programs instead")
    ps.add_argument("--drop", nargs="+", default=[], metavar="PROGRAM",
                    help="with --programs: forget these programs (your names for them and your uploads; the "
                         "operator's drop takes them from every client); the server deletes a program no "
                         "client has any more")
    add_json_flag(ps, shape(c.InstanceList, c.InstanceEntry),
                  shape(c.ProgramList, c.ProgramEntry, when="with --programs"))
    add_client_args(ps)
    ps.set_defaults(func=commands.cmd_ps)

    stats = sub.add_parser("stats", help="show the server's batches, device time and interception policy",
                           description="Batches and free memory, device time (and the part spent recomputing "
                                       "discarded K/V), the interception policy's moves and its cost profile: "
                                       "each cost learnt from the served model's batches, or its default.")
    add_json_flag(stats, shape(c.StatsReply), "profile: null or an object with "
                  + ", ".join(f.name for f in dataclasses.fields(c.InterceptionProfile)),
                  "replicas: a list, each item with " + ", ".join(f.name for f in dataclasses.fields(c.ReplicaStats)))
    add_client_args(stats)
    stats.set_defaults(func=commands.cmd_stats)

    exports = sub.add_parser(
        "exports", help="list named KvPage exports (drop them with --drop)",
        description="List the KvPage exports inferlets published by name (oldest first), or drop some. An export "
                    "outlives an exporter that finishes (a prompt cache); a killed exporter's exports are dropped "
                    "with it, and exports whose exporter ended are dropped, oldest first, when the KvPage pool "
                    "runs out. Dropping one frees the pages no importer holds.")
    exports.add_argument("--drop", nargs="+", default=[], metavar="NAME", help="release these exports")
    exports.add_argument("--owner", default="", metavar="CLIENT",
                         help="--drop another client's exports (operator only; default: your own)")
    add_json_flag(exports, shape(c.ExportList, c.ExportEntry))
    add_client_args(exports)
    exports.set_defaults(func=commands.cmd_exports)

    kill = sub.add_parser("kill", help="terminate an instance")
    kill.add_argument("instance_id", metavar="INSTANCE")
    add_client_args(kill)
    kill.set_defaults(func=commands.cmd_kill)

    send = sub.add_parser("send", help="send a message to an instance")
    send.add_argument("instance_id", metavar="INSTANCE")
    send.add_argument("text", metavar="TEXT")
    add_client_args(send)
    send.set_defaults(func=commands.cmd_send)

    token = sub.add_parser(
        "token", help="manage the clients a server admits (operator only)",
        description="Every client of an oven server holds a token; the server's owner holds the operator's, which "
                    "`oven serve` writes to its state directory. `add NAME` admits a new client and prints its "
                    "token (give it to them: pass it with --token or OVEN_TOKEN); `remove NAME` refuses it from now "
                    "on; `list` names them. A client sees and controls only its own instances, exports and program "
                    "names.")
    token.add_argument("action", choices=("add", "remove", "list"))
    token.add_argument("name", nargs="?", metavar="NAME", help="a lowercase letter, then up to 31 of a-z 0-9 _ -")
    add_json_flag(token, shape(c.ClientList, when="list"), shape(c.ClientToken, when="add"))
    add_client_args(token)
    token.set_defaults(func=commands.cmd_token)

    adapters = sub.add_parser(
        "adapters", help="list, add or remove the LoRA adapters inferlets may use",
        description="LoRA adapters (PEFT folders: adapter_config.json + adapter_model.safetensors) that inferlets "
                    "open by name (open_adapter). With a server running: `list` shows its adapters and their ids "
                    "(any client); `add NAME DIR` loads DIR (a folder on the server's machine), checked against "
                    "the served model, and keeps it in the server's adapter store; `remove NAME` unloads and "
                    "deletes it (both operator only). With no server running, they edit the local adapter store "
                    "that `oven serve` loads at start. The AsyncLM adapter ships with oven as `asynclm`.")
    adapters.add_argument("action", nargs="?", default="list", choices=("list", "add", "remove"))
    adapters.add_argument("name", nargs="?", metavar="NAME", help="1-64 of A-Z a-z 0-9 . _ -")
    adapters.add_argument("dir", nargs="?", metavar="DIR", help="add: the PEFT LoRA folder")
    add_json_flag(adapters, shape(c.AdapterList, c.AdapterEntry, when="list"), shape(c.AdapterEntry, when="add"),
                  'list with no server running: {"adapters": null, "store": PATH, "stored": [...], "packaged": [...]}')
    add_client_args(adapters)
    adapters.set_defaults(func=commands.cmd_adapters)

    build = sub.add_parser(
        "build", help="build inferlet folders into components (DIR/NAME.wasm)",
        description="Build each DIR into DIR/NAME.wasm (NAME: the folder's name). A folder with app.py is a "
                    "Python inferlet (componentize-py, with sdk/python); one with Cargo.toml is a Rust inferlet "
                    "(Debian's cargo for wasm32-unknown-unknown, then wasm-tools). Skips a folder whose output "
                    "is newer than every source (its files, the SDK, proto/wit and oven's build tooling) "
                    "unless --force.",
        epilog="environment: OVEN_COMPONENTIZE_PY, OVEN_CARGO, OVEN_RUSTC override the toolchain's paths "
               "(defaults: the venv's componentize-py, /usr/bin/cargo, /usr/bin/rustc).")
    build.add_argument("dirs", nargs="+", metavar="DIR", help="an inferlet folder")
    build.add_argument("-o", "--output", metavar="OUT", help="write the component here (one DIR only)")
    build.add_argument("--force", action="store_true", help="build even when the output is up to date")
    build.add_argument("-q", "--quiet", action="store_true", help="say nothing about up-to-date folders")
    build.add_argument("-j", "--jobs", type=positive_int, metavar="N",
                       help="build N folders at once (default: this machine's cores, up to 4)")
    build.set_defaults(func=cmd_build)

    new = sub.add_parser(
        "new", help="start an inferlet from a template",
        description="Create PARENT/NAME/ holding a chat-completion inferlet that `oven build PARENT/NAME` builds "
                    "and `oven run PARENT/NAME/NAME.wasm -- PROMPT` runs.")
    new.add_argument("name", metavar="NAME", help="the inferlet's name: a letter, then letters, digits, - or _")
    new.add_argument("--lang", choices=("python", "rust"), default="python", help="default %(default)s")
    new.add_argument("--dir", default=".", metavar="PARENT", help="where to create NAME/ (default: here)")
    new.set_defaults(func=cmd_new)

    prep = sub.add_parser("prepare-model", help="convert and cache a model ahead of time")
    prep.add_argument("model", nargs="?", default=DEFAULT_MODEL, help=f"model spec (default {DEFAULT_MODEL})")
    prep.set_defaults(func=cmd_prepare_model)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "inference":  # its flags mirror InferenceConfig; let the server parse them
        from oven.inference.server import main as inference_main

        return inference_main(argv[1:])
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return EXIT_USAGE
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        return args.func(args)
    except KeyboardInterrupt:
        print("\noven: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `oven ... | head`: the reader has what it wanted
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # nothing left to flush at exit
        return 128 + signal.SIGPIPE


if __name__ == "__main__":
    sys.exit(main())

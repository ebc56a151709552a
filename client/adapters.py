"""``oven adapters``: list, add and remove the LoRA adapters a server offers to inferlets.

With a server answering, the verb asks it (adding and removing are the operator's): an added
folder is loaded, and so checked against the served model, before the server keeps it. With no
server, it edits the adapter store that ``oven serve`` loads at start (``--adapter-dir``, else
``$OVEN_CACHE_DIR/adapters``), checking only what needs no model: the two files and their JSON.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from oven.control.adapter_store import PACKAGED, AdapterStore, AdapterStoreError
from oven.control.config import ControlConfig
from oven.proto import control as c
from oven.proto.config_loader import config_from_args

from .connect import EXIT_FAILURE, EXIT_USAGE, NoServer, client_of, target_of
from .json_output import print_json
from .rpc import OvenClient


def adapters_verb(args: argparse.Namespace) -> int:
    """Run ``oven adapters``; a usage mistake or a refused folder is one ``oven: ...`` line here, the
    server's refusals are left to the caller (``commands._verb``)."""
    needs = {"add": ("name", "dir"), "remove": ("name",), "list": ()}[args.action]
    missing = [arg.upper() for arg in needs if not getattr(args, arg)]
    if missing:
        print(f"oven adapters {args.action}: {' and '.join(missing)} required", file=sys.stderr)
        return EXIT_USAGE
    if args.json and args.action == "remove":
        print("oven adapters remove: --json goes with list and add", file=sys.stderr)
        return EXIT_USAGE
    target = target_of(args)
    try:
        with client_of(target) as client:
            return _on_server(args, client)
    except NoServer:
        if target.explicit:  # a server named on purpose that is not there: never edit a local store instead
            raise
    return _offline(args)


def _on_server(args: argparse.Namespace, client: OvenClient) -> int:
    if args.action == "add":
        folder = Path(args.dir).expanduser().resolve()
        entry = client.add_adapter(args.name, str(folder))
        if args.json:
            print_json(entry)
            return 0
        print(f"added {entry.name} as adapter {entry.adapter_id} ({_shape(entry)})")
    elif args.action == "remove":
        client.remove_adapter(args.name)
        print(f"removed {args.name}")
    elif args.json:
        print_json(c.AdapterList(client.adapters()))
    else:
        _print_table(client.adapters())
    return 0


def _offline(args: argparse.Namespace) -> int:
    control = config_from_args(ControlConfig, argparse.Namespace(config=args.config), section="control")
    store = AdapterStore(control.adapters_path)
    try:
        if args.action == "add":
            path = store.add(args.name, Path(args.dir))
            print(f"no server runs: added {args.name} to the adapter store ({path}); `oven serve` loads it at start, "
                  "checking it against its model")
        elif args.action == "remove":
            store.remove(args.name)
            print(f"no server runs: removed {args.name} from the adapter store ({store.root})")
        elif args.json:  # no server to ask which are loaded: null, and what `oven serve` would load
            print_json({"adapters": None, "store": str(store.root), "stored": store.names(),
                        "packaged": list(PACKAGED)})
        else:
            print(f"no server runs; the adapter store ({store.root}) holds: {', '.join(store.names()) or 'none'}; "
                  f"shipped with oven: {', '.join(PACKAGED)}")
    except AdapterStoreError as exc:
        print(f"oven: {exc}", file=sys.stderr)
        return EXIT_FAILURE
    return 0


def _shape(entry: c.AdapterEntry) -> str:
    return f"rank {entry.rank} on {','.join(entry.target_modules)}, {entry.num_params / 1e6:.2f} M parameters"


def _print_table(entries: list[c.AdapterEntry]) -> None:
    print(f"{'ADAPTER':24} {'ID':>4}  {'STATE':8} DETAILS")
    for e in entries:
        details = _shape(e) if e.state == "loaded" else e.error
        print(f"{e.name:24} {e.adapter_id:4d}  {e.state:8} {details}{' (ships with oven)' if e.packaged else ''}")

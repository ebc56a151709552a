"""LoRA adapters in a running `oven serve` (tiny model): `oven adapters` with and without a server,
operator-only changes, refused folders, and ids that survive a restart of the inference process.
(The SDK side, opening an adapter by name and decoding on it, is in test_sdk_conformance.py.)"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import signal
import time

import pytest
from conftest import write_adapter
from harness import Server, built, oven, wait_exit

from oven.client.rpc import OvenClient
from oven.inference.models import resolve_model

PROMPT = "Once upon a time, in a land far away, there lived a"


@pytest.fixture(scope="module")
def tiny_config():
    return resolve_model("tiny").config


def cli(srv: Server, *args: str, token: str | None = None):
    token_file = srv.root / "cli.token"  # not on the command line, which warns
    token_file.write_text(token or srv.operator_token)
    return oven("adapters", *args, "--server", srv.endpoint, "--token", f"@{token_file}")


def decode_on_adapter(client: OvenClient, name: str) -> dict:
    """The conformance inferlet's adapter scenario: the adapter's id and greedy tokens."""
    instance_id = client.launch(client.upload(built("conformance")), [f"adapter|{name}|{PROMPT}|8"])
    messages, deadline = [], time.monotonic() + 120
    for event in client.events(poll_s=0.1):
        assert time.monotonic() < deadline, f"{instance_id} did not exit"
        if event is not None and event.instance_id == instance_id:
            if event.kind == "message":
                messages.append(json.loads(event.text))
            elif event.kind == "exit":
                assert (event.exit_code, event.text) == (0, "")
                break
    (report,) = messages
    return report


def test_oven_adapters_adds_lists_and_removes_for_the_operator_only(tmp_path, tiny_config):
    write_adapter(tmp_path / "good", tiny_config)
    write_adapter(tmp_path / "foreign", dataclasses.replace(tiny_config, hidden_size=32))
    srv = Server(tmp_path, "--adapter-dir", str(tmp_path / "store"))
    try:
        with srv.client() as operator:
            alice = operator.add_client("alice")
        assert cli(srv).stdout.splitlines() == ["ADAPTER                    ID  STATE    DETAILS"]
        added = cli(srv, "add", "tiny-lora", str(tmp_path / "good"))
        assert added.returncode == 0, added.stderr
        assert re.fullmatch(r"added tiny-lora as adapter 1 \(rank 4 on q_proj,v_proj, 0\.\d\d M parameters\)\n",
                            added.stdout), added.stdout
        refused = cli(srv, "add", "foreign", str(tmp_path / "foreign"))  # the inference process's check, one line
        assert refused.returncode == 1
        assert refused.stderr == (f"oven: bad_adapter: {tmp_path / 'foreign'}: lora_A of layers.0.self_attn.q_proj is "
                                  f"[4, 32], expected [4, {tiny_config.hidden_size}] for rank 4 on tiny (hidden size "
                                  f"{tiny_config.hidden_size}): trained for another model?\n")
        assert sorted(p.name for p in (tmp_path / "store").iterdir()) == ["tiny-lora"]  # the refused one left nothing

        for args in (["add", "mine", str(tmp_path / "good")], ["remove", "tiny-lora"]):
            denied = cli(srv, *args, token=alice)
            assert (denied.returncode, denied.stderr) == (
                1, f"oven: forbidden: only the operator may {args[0]} adapters\n")
        listed = cli(srv, token=alice).stdout.splitlines()  # any client may see what its inferlets can open
        assert listed[1].split()[:3] == ["tiny-lora", "1", "loaded"]

        assert cli(srv, "remove", "tiny-lora").stdout == "removed tiny-lora\n"
        assert not (tmp_path / "store" / "tiny-lora").exists()
        with srv.client() as operator:
            assert operator.adapters() == []
            again = operator.add_adapter("tiny-lora", str(tmp_path / "good"))
        assert again.adapter_id == 3  # ids are never handed out again (2 went to the refused folder)
        missing = cli(srv, "remove", "nope")
        assert (missing.returncode, missing.stderr) == (1, "oven: bad_adapter: no adapter named 'nope'\n")
    finally:
        srv.stop()


def test_without_a_server_the_cli_edits_the_store_that_serve_loads(tmp_path, tiny_config, monkeypatch,
                                                                   tokenizer_donor):
    monkeypatch.setenv("OVEN_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("OVEN_TOKENIZER_DONOR", tokenizer_donor)
    write_adapter(tmp_path / "good", tiny_config)
    added = oven("adapters", "add", "tiny-lora", str(tmp_path / "good"))
    assert added.returncode == 0, added.stderr
    assert added.stdout.startswith(f"no server runs: added tiny-lora to the adapter store "
                                   f"({tmp_path / 'cache' / 'adapters' / 'tiny-lora'})")
    bad = oven("adapters", "add", "../x", str(tmp_path / "good"))
    assert (bad.returncode, bad.stderr) == (
        1, "oven: an adapter name is 1-64 of A-Z a-z 0-9 . _ - (not starting with . _ -); not '../x'\n")
    not_a_folder = oven("adapters", "add", "other", str(tmp_path / "nothing"))
    assert (not_a_folder.returncode, not_a_folder.stderr) == (1, f"oven: {tmp_path / 'nothing'}: not a folder\n")
    reserved = oven("adapters", "add", "asynclm", str(tmp_path / "good"))
    assert reserved.stderr == "oven: 'asynclm' is the name of an adapter that ships with oven; choose another\n"

    srv = Server(tmp_path, "--adapter-dir", str(tmp_path / "cache" / "adapters"))
    try:
        with srv.client() as client:
            (entry,) = client.adapters()
            assert (entry.name, entry.adapter_id, entry.state, entry.rank) == ("tiny-lora", 1, "loaded", 4)
    finally:
        srv.stop()
    removed = oven("adapters", "remove", "tiny-lora")
    assert removed.stdout.startswith("no server runs: removed tiny-lora")
    assert oven("adapters").stdout.startswith("no server runs; the adapter store")


def test_adapters_survive_an_inference_restart_with_the_same_ids(tmp_path, tiny_config):
    """The supervisor's new inference process has every adapter loaded again under its id before any
    batch: an inferlet gets the same id and the same tokens as before the crash."""
    for name in ("first", "second"):
        write_adapter(tmp_path / "store" / name, tiny_config, targets=("q_proj", "o_proj"))
    srv = Server(tmp_path, "--adapter-dir", str(tmp_path / "store"), programs=("conformance",))
    try:
        with srv.client() as client:
            before = {name: decode_on_adapter(client, name) for name in ("first", "second")}
            assert [before[n]["id"] for n in ("first", "second")] == [1, 2]
            assert before["first"]["adapted"] != before["second"]["adapted"]
            (child,) = srv.children()
            os.kill(child, signal.SIGKILL)
            deadline = time.monotonic() + 30
            while srv.children() in ([child], []):
                assert time.monotonic() < deadline, "no new inference process"
                time.sleep(0.1)
            after = {name: decode_on_adapter(client, name) for name in ("second", "first")}
            assert after == before
            assert [(a.name, a.adapter_id, a.state) for a in client.adapters()] == [
                ("first", 1, "loaded"), ("second", 2, "loaded")]
    finally:
        srv.stop()
    assert "restarting the inference process" in srv.proc.stderr.read()


def test_an_unknown_adapter_or_a_removed_one_is_a_clear_error(tmp_path, tiny_config):
    write_adapter(tmp_path / "store" / "tiny-lora", tiny_config)
    srv = Server(tmp_path, "--adapter-dir", str(tmp_path / "store"), programs=("conformance",))
    try:
        with srv.client() as client:
            instance_id = client.launch(client.upload(built("conformance")), [f"adapter|typo|{PROMPT}|8"])
            event = wait_exit(client, instance_id)
            assert event.exit_code == 1
            assert event.text.endswith("no adapter named 'typo' on this server (it has: tiny-lora)"), event.text
    finally:
        srv.stop()

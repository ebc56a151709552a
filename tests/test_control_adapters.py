"""control/runtime/adapters.py and control/adapter_store.py without processes: the ids the control
process gives adapters, what it sends the inference process (before and after a restart), and what
an inferlet or an operator is told. (With real processes: test_adapters_served.py.)"""

from __future__ import annotations

import json

import pytest

from oven.control.adapter_store import AdapterStore, AdapterStoreError
from oven.control.runtime.adapters import AdapterUnavailable, Adapters
from oven.proto import inference as p

TOKENIZER = p.TokenizerSpec("{}", "", "<s>", "</s>", [2])


def info(traits=(p.TRAIT_FORWARD_TEXT, p.TRAIT_LORA_ADAPTERS)) -> p.InfoReply:
    return p.InfoReply("tiny", "llama", 10, 8, 2, 64, "cpu", "float32", "torch", 16, 4, 4, 0, 8, 64, 20, list(traits),
                       TOKENIZER, max_adapters=8)


def peft_folder(folder):
    """Enough of a PEFT folder for the store (the inference process, faked here, checks the rest)."""
    folder.mkdir(parents=True)
    (folder / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA", "r": 4}))
    (folder / "adapter_model.safetensors").write_bytes(b"weights")
    return folder


class FakeInference:
    """Records what is sent to each replica (request ids count per replica, as each has its own client);
    answers load requests when told to."""

    def __init__(self):
        self.sent: list[tuple[int, object]] = []  # replica 0's
        self.by_replica: dict[int, list[tuple[int, object]]] = {0: self.sent}

    def send(self, replica: int, request) -> int:
        sent = self.by_replica.setdefault(replica, [])
        sent.append((len(sent) + 1, request))
        return len(sent)

    def accept(self, adapters: Adapters, request_id: int, rank: int = 4, replica: int = 0) -> None:
        request = dict(self.by_replica[replica])[request_id]
        adapter = p.AdapterInfo(request.adapter_id, request.name, rank, 8.0, 2.0, ["q_proj"], 100)
        assert adapters.settle(replica, request_id, p.AdapterReply(adapter))


@pytest.fixture
def world(tmp_path):
    store = AdapterStore(tmp_path / "store")
    for name in ("b-one", "a-two"):
        store.add(name, peft_folder(tmp_path / name))
    inference = FakeInference()
    adapters = Adapters(store, inference.send, info())
    adapters.load_stored(lambda _replica, request_id: p.AdapterReply(p.AdapterInfo(
        dict(inference.sent)[request_id].adapter_id, dict(inference.sent)[request_id].name, 4, 8.0, 2.0, ["q_proj"],
        100)))
    return tmp_path, store, inference, adapters


def test_stored_adapters_get_ids_and_a_restart_loads_them_again_under_the_same_ids(world):
    _, _, inference, adapters = world
    assert [(r.adapter_id, r.name) for _, r in inference.sent] == [(1, "a-two"), (2, "b-one")]
    assert (adapters.open("a-two"), adapters.open("b-one")) == (1, 2)
    inference.sent.clear()
    adapters.reload(0)  # a new inference process serves
    assert [(r.adapter_id, r.name) for _, r in inference.sent] == [(1, "a-two"), (2, "b-one")]
    assert adapters.is_loaded(2) and not adapters.is_loaded(3)


def test_an_add_is_answered_once_loaded_and_a_refused_one_leaves_nothing(world):
    tmp_path, store, inference, adapters = world
    outcomes = []
    adapters.add("good", peft_folder(tmp_path / "good"), outcomes.append)
    with pytest.raises(AdapterUnavailable, match="adapter 'good' is still loading"):
        adapters.open("good")
    inference.accept(adapters, inference.sent[-1][0])
    assert [(a.name, a.adapter_id, a.state) for a in outcomes] == [("good", 3, "loaded")]

    adapters.add("bad", peft_folder(tmp_path / "bad"), outcomes.append)
    path = str(store.path("bad"))
    assert adapters.settle(0, inference.sent[-1][0], p.ErrorReply(p.ERR_BAD_ADAPTER, f"{path}: rank r=0 is outside"))
    assert (outcomes[-1].state, outcomes[-1].error) == ("failed", f"{path}: rank r=0 is outside")
    assert "bad" not in store.names() and "bad" not in [a.name for a in adapters.entries()]
    with pytest.raises(AdapterStoreError, match="an adapter named 'good' exists; remove it first"):
        adapters.add("good", tmp_path / "good", outcomes.append)


def test_removed_ids_are_never_given_again(world):
    tmp_path, store, inference, adapters = world
    adapters.remove("a-two")
    assert inference.sent[-1][1] == p.UnloadAdapterRequest("a-two")
    assert store.names() == ["b-one"] and not adapters.is_loaded(1)
    adapters.add("a-two", peft_folder(tmp_path / "again"), lambda _: None)
    assert inference.sent[-1][1].adapter_id == 3
    with pytest.raises(AdapterStoreError, match="no adapter named 'nope'"):
        adapters.remove("nope")


def test_with_two_replicas_an_adapter_is_loaded_once_both_took_it(tmp_path):
    inference = FakeInference()
    adapters = Adapters(AdapterStore(tmp_path / "store"), inference.send, info(), num_replicas=2)
    outcomes = []
    adapters.add("good", peft_folder(tmp_path / "good"), outcomes.append)
    inference.accept(adapters, 1, replica=1)
    with pytest.raises(AdapterUnavailable, match="adapter 'good' is still loading"):
        adapters.open("good")  # replica 0 has not answered
    inference.accept(adapters, 1, replica=0)
    assert [(a.name, a.state) for a in outcomes] == [("good", "loaded")] and adapters.open("good") == 1

    adapters.add("bad", peft_folder(tmp_path / "bad"), outcomes.append)
    inference.accept(adapters, 2, replica=0)
    assert adapters.settle(1, 2, p.ErrorReply(p.ERR_BAD_ADAPTER, "no room"))  # refused by replica 1
    assert (outcomes[-1].state, outcomes[-1].error) == ("failed", "no room")
    assert all(sent[-1][1] == p.UnloadAdapterRequest("bad") for sent in inference.by_replica.values())

    adapters.reload(1)  # replica 1 restarted: it alone loads "good" again, under its id
    assert [r for _, r in inference.by_replica[0]][-1] == p.UnloadAdapterRequest("bad")
    assert inference.by_replica[1][-1][1] == p.LoadAdapterRequest(1, "good", str(adapters.entries()[0].path))
    assert adapters.open("good") == 1  # still loaded: replica 1 answers its load before any batch


def test_what_an_inferlet_is_told(world, tmp_path):
    _, _, _, adapters = world
    with pytest.raises(AdapterUnavailable, match=r"^no adapter named 'typo' on this server \(it has: a-two, b-one\)$"):
        adapters.open("typo")
    without = Adapters(AdapterStore(tmp_path / "empty"), FakeInference().send, info(traits=[p.TRAIT_FORWARD_TEXT]))
    with pytest.raises(AdapterUnavailable, match=r"^this server takes no LoRA adapters \(tiny lacks the "
                                                 r"lora-adapters trait\)$"):
        without.open("a-two")


@pytest.mark.parametrize("name", ["../x", "a/b", ".hidden", "", "x" * 65, "a\x00"])
def test_an_adapter_name_is_never_a_path(tmp_path, name):
    with pytest.raises(AdapterStoreError, match="an adapter name is 1-64 of"):
        AdapterStore(tmp_path / "store").add(name, peft_folder(tmp_path / "src"))
    assert not (tmp_path / "store").exists() or not any((tmp_path / "store").iterdir())


def test_the_store_copies_only_the_two_files(tmp_path):
    source = peft_folder(tmp_path / "src")
    (source / "adapter_model.bin").write_bytes(b"a pickle")
    path = AdapterStore(tmp_path / "store").add("x", source)
    assert sorted(f.name for f in path.iterdir()) == ["adapter_config.json", "adapter_model.safetensors"]
    (tmp_path / "plain").mkdir()
    (tmp_path / "plain" / "adapter_config.json").write_text("{}")
    (tmp_path / "plain" / "adapter_model.safetensors").write_bytes(b"")
    with pytest.raises(AdapterStoreError, match="does not describe a LoRA adapter"):
        AdapterStore(tmp_path / "store").add("y", tmp_path / "plain")

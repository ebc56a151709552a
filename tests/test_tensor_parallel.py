"""Tensor parallelism: two ranks over gloo serve what one process serves, through the real server.

Each case decodes the same way on a tensor-parallel server and on an in-process engine (one rank):
a prefill whose full next-token distribution is compared, the prompt's page copied, offloaded and
restored elsewhere (so a rank that missed one of those would attend to zeros), then greedy steps
drawn in the server through token futures, base-model and adapter sequences in one batch.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import make_engine, write_adapter

import oven.client.asynclm
from oven.control.inference_client import InferenceClient
from oven.control.inference_process import start_inference_process
from oven.inference.config import InferenceConfig, ModelConfig
from oven.inference.models import resolve_model
from oven.inference.sharding import Shard, check_shardable
from oven.inference.tensor_parallel import EXIT_RANK_DIED
from oven.proto import inference as p
from oven.proto.endpoints import private_endpoint

NUM_PAGES, NUM_HOST, NUM_STEPS = 64, 8, 32  # 32 steps: the 11-token prompt grows over three pages
PAGES_PER_SEQUENCE = 32
PROMPT = [1, 504, 2988, 314, 42, 476, 57, 5248, 2567, 1109, 28]
ASYNCLM_ADAPTER = Path(oven.client.asynclm.__file__).parent / "adapter"
SERVER = [sys.executable, "-m", "oven.inference.server", "--quiet"]


SETTINGS = dict(dtype="float32", num_kv_pages=NUM_PAGES, num_host_pages=NUM_HOST, num_embeds=256, torch_threads=1)


def decode(call, adapter_ids: list[int], vocab_size: int) -> tuple[list[np.ndarray], list[list[int]]]:
    """One sequence per adapter id (0: the base model), decoded in one batch per step: (each one's
    probabilities over the whole vocabulary after the prompt, each one's NUM_STEPS greedy tokens)."""
    n = len(PROMPT)
    first = call(p.ForwardTextRequest([
        p.ForwardTextItem(PROMPT, list(range(n)), [s * PAGES_PER_SEQUENCE], n, [n - 1], top_k=vocab_size,
                          adapter_id=a, sample=p.SampleSpec(2 * s, p.SAMPLE_GREEDY))
        for s, a in enumerate(adapter_ids)]))
    assert first.errors == [None] * len(adapter_ids)
    probs = [_by_token(dists[0], vocab_size) for dists in first.dists]
    # The prompt's page, copied to the next page, through the host tier, into the one after: decoding
    # goes on from there.
    bases = [s * PAGES_PER_SEQUENCE for s in range(len(adapter_ids))]
    for request in (p.CopyKvPageRequest([p.CopyKvPageItem(b, b + 1, 0, 0, n) for b in bases]),
                    p.OffloadRequest([p.OffloadItem(b + 1, s) for s, b in enumerate(bases)]),
                    p.RestoreRequest([p.RestoreItem(s, b + 2) for s, b in enumerate(bases)])):
        assert call(request).errors == [None] * len(adapter_ids)
    tokens = [[t] for t in first.sampled]
    for step in range(1, NUM_STEPS):
        length = n + step
        pages = -(-length // 16)
        reply = call(p.ForwardTextRequest([
            p.ForwardTextItem([0], [length - 1], list(range(b + 2, b + 2 + pages)), length - 16 * (pages - 1), [0],
                              top_k=1, adapter_id=a, token_futures=[2 * s + (step - 1) % 2],
                              sample=p.SampleSpec(2 * s + step % 2, p.SAMPLE_GREEDY))
            for s, (a, b) in enumerate(zip(adapter_ids, bases))]))
        assert reply.errors == [None] * len(adapter_ids)
        for seq, token in zip(tokens, reply.sampled):
            seq.append(token)
    call(p.FreeFuturesRequest(list(range(2 * len(adapter_ids)))))
    return probs, tokens


def _by_token(dist: p.TopKDist, vocab_size: int) -> np.ndarray:
    probs = np.zeros(vocab_size)
    probs[np.frombuffer(dist.token_ids, "<i4")] = np.frombuffer(dist.probs, "<f4")
    return probs


def load(call, path: Path) -> None:
    reply = call(p.LoadAdapterRequest(1, "lora", str(path)))
    assert isinstance(reply, p.AdapterReply), reply


def reference(model: str, adapter: Path | None, adapter_ids: list[int], device: str = "cpu"):
    """What one process decodes (see :func:`decode`)."""
    engine = make_engine(model, device=device, **SETTINGS)
    if adapter is not None:
        load(engine.handle, adapter)
    return decode(engine.handle, adapter_ids, engine.model.config.vocab_size)


def assert_same(got, want) -> None:
    (got_probs, got_tokens), (want_probs, want_tokens) = got, want
    for g, w in zip(got_probs, want_probs):
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=0)
    assert got_tokens == want_tokens


@pytest.fixture(scope="module")
def tiny_adapter(tmp_path_factory):
    """A random adapter on every projection of the tiny model (all four input groups)."""
    folder = tmp_path_factory.mktemp("tiny-lora")
    write_adapter(folder, resolve_model("tiny").config, targets=("q_proj", "k_proj", "v_proj", "o_proj",
                                                                 "gate_proj", "up_proj", "down_proj"))
    return folder


@pytest.mark.parametrize("model, adapter, device", [
    pytest.param("tiny", None, "cpu", id="tiny"),
    pytest.param("smollm2-135m-instruct", ASYNCLM_ADAPTER, "cpu", id="smollm2"),
    pytest.param("tiny", None, "cuda", id="tiny-nccl", marks=[pytest.mark.gpu, pytest.mark.skipif(
        torch.cuda.device_count() < 2, reason="needs two CUDA devices")])])
def test_two_ranks_decode_as_one_process_until_one_is_killed(model, adapter, device, tiny_adapter):
    """tiny splits evenly (1 kv head each); SmolLM2's 3 kv heads split 2 + 1, with the AsyncLM adapter
    (no gate_proj: its gate/up group has one projection); on CUDA the ranks all-reduce over NCCL, in
    float32 like the rest. The pools are sized by a memory budget, which buys SmolLM2's rank 1 (fewer
    heads) more pages than rank 0: both take rank 0's count, so a page past it fails on both and the
    ranks' batches stay alike. Then rank 1 is killed: rank 0 says so and exits, for its supervisor to
    restart the group."""
    adapter = adapter or tiny_adapter
    rank_0_page_bytes = Shard.of(resolve_model(model).config, 0, 2).config.kv_page_bytes(16, 4)
    pools = dict(num_kv_pages=None, num_host_pages=None, kv_memory_bytes=NUM_PAGES * rank_0_page_bytes)
    config = InferenceConfig(model=model, device=device, endpoint=private_endpoint(), tensor_parallel=2,
                             **{**SETTINGS, **pools})
    with start_inference_process(config, timeout_s=180) as server:
        assert (server.info.num_kv_pages, server.info.num_host_pages) == (NUM_PAGES, NUM_PAGES)
        with server.client(timeout_s=60) as client:  # (ranks out of step would wait on each other)
            past_the_pool = client.call(p.ForwardTextRequest([p.ForwardTextItem([1], [0], [NUM_PAGES], 1, [0])]))
            assert past_the_pool.errors[0].code == p.ERR_BAD_PAGE
            load(client.call, adapter)
            got = decode(client.call, [0, 1], server.info.vocab_size)
        assert_same(got, reference(model, adapter, [0, 1], device))
        (rank_1,) = [int(pid) for pid in subprocess.run(["pgrep", "-P", str(server.proc.pid)], capture_output=True,
                                                         text=True).stdout.split()]
        os.kill(rank_1, signal.SIGKILL)
        assert server.proc.wait(10) == EXIT_RANK_DIED
        deadline = time.monotonic() + 5  # (its stderr is read on a thread)
        while "died" not in server.stderr_tail and time.monotonic() < deadline:
            time.sleep(0.05)
        assert server.stderr_tail.endswith("oven inference: tensor-parallel rank 1 died: killed by signal 9\n")


def test_ranks_started_apart_meet_by_env_and_agree_on_adapters(tmp_path, tiny_adapter):
    """Two "hosts" over loopback: rank 0 and rank 1 started separately (rank 1 with no settings but its
    rank: it takes rank 0's). An adapter folder that rank 1 cannot see (a relative path, from another
    working directory) is refused by both; when rank 0 is killed, rank 1 exits."""
    hosts = [tmp_path / "host0", tmp_path / "host1"]
    for host in hosts:
        host.mkdir()
    (hosts[0] / "lora").symlink_to(tiny_adapter)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(sock.getsockname()[1])}
    env.pop("OVEN_PARENT_PID", None)
    endpoint = f"ipc://{tmp_path / 'rank0.sock'}"
    flags = [f"--{k.replace('_', '-')}={v}" for k, v in SETTINGS.items()]
    rank_0 = subprocess.Popen([*SERVER, "--model", "tiny", *flags, "--endpoint", endpoint, "--tensor-parallel", "2",
                               "--tp-rank", "0"], cwd=hosts[0], env=env, stderr=subprocess.PIPE, text=True)
    rank_1 = subprocess.Popen([*SERVER, "--tensor-parallel", "2", "--tp-rank", "1"], cwd=hosts[1], env=env,
                              stderr=subprocess.PIPE, text=True)
    try:
        with InferenceClient(endpoint, timeout_s=120) as client:
            refused = client.wait_reply(client.send(p.LoadAdapterRequest(1, "lora", "lora")))
            assert refused.code == p.ERR_BAD_ADAPTER and refused.message.startswith("tensor-parallel rank 1: lora")
            assert client.info().adapters == []  # rank 0 loaded it, and unloaded it again
            got = decode(client.call, [0], client.info().vocab_size)
        assert_same(got, reference("tiny", None, [0]))
        rank_0.kill()
        assert rank_1.wait(20) == EXIT_RANK_DIED
        assert "oven inference: tensor-parallel rank 1: the group broke" in rank_1.stderr.read()
    finally:
        for proc in (rank_0, rank_1):
            proc.kill()
            proc.wait()


def test_shards_split_kv_groups_as_evenly_as_they_go_and_refuse_more_ranks_than_kv_heads():
    smollm2 = ModelConfig("smollm2", vocab_size=49152, hidden_size=576, intermediate_size=1536, num_layers=30,
                          num_q_heads=9, num_kv_heads=3, head_dim=64, rms_norm_eps=1e-5, tie_word_embeddings=True,
                          max_position=8192)
    shards = [Shard.of(smollm2, rank, 2) for rank in range(2)]
    assert [(s.config.num_kv_heads, s.config.num_q_heads, s.config.intermediate_size) for s in shards] == \
        [(2, 6, 768), (1, 3, 768)]
    assert [s.features("q_proj") for s in shards] == [slice(0, 384), slice(384, 576)]
    assert [s.features("k_proj") for s in shards] == [slice(0, 128), slice(128, 192)]
    assert shards[1].split("model.layers.0.mlp.down_proj.weight") == (1, slice(768, 1536))
    assert shards[1].split("model.layers.0.input_layernorm.weight") is None
    with pytest.raises(ValueError, match="^tensor_parallel 4 exceeds the 3 kv heads of smollm2: each rank must hold"):
        check_shardable(smollm2, 4)


def test_more_ranks_than_kv_heads_are_refused_before_the_group_forms():
    """(As rank 0 of a group whose ranks join from elsewhere: with its own children it would start them
    first, to load beside it, and they would die with it.)"""
    env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "1"}  # never reached
    result = subprocess.run([*SERVER, "--model", "tiny", "--endpoint", private_endpoint(), "--tensor-parallel", "3",
                             "--tp-rank", "0"], capture_output=True, text=True, timeout=120, env=env)
    assert (result.returncode, result.stderr) == (
        2, "oven inference: tensor_parallel 3 exceeds the 2 kv heads of tiny: each rank must hold at least one\n")

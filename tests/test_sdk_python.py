"""The Python SDK (sdk/python/inferlet): samplers on the host, and text completion end to end.

``text-completion --steps`` decodes with ``flush`` and ``next_dist`` instead of ``generate``:
the tests below pin their semantics (the Rust SDK's): a flush forwards every pending token but
the last, and a decode step with nothing pending forwards the last token again.
"""

from __future__ import annotations

import importlib.util
import math
import random
import struct
import sys
from collections import Counter
from pathlib import Path

import pytest
from harness import assert_pools_full, direct_greedy, events_of, messages, refused, run
from oven.control.tokenizer import Tokenizer

SDK = Path(__file__).resolve().parent.parent / "sdk" / "python" / "inferlet"


def load(module: str):
    """An SDK module that needs no host imports, loaded outside wasm."""
    spec = importlib.util.spec_from_file_location(f"sdk_{module}", SDK / f"{module}.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses look their module up
    spec.loader.exec_module(mod)
    return mod


sampling, stop, pages = load("sampling"), load("stop"), load("pages")
IDS, PROBS = [7, 3, 9, 1], [0.5, 0.3, 0.15, 0.05]


def test_truncating_samplers_keep_the_right_candidates():
    assert sampling.Greedy().sample(IDS, PROBS) == 7
    assert sampling.TopK(2, seed=0).keep(PROBS) == 2
    assert sampling.TopP(0.8, seed=0).keep(PROBS) == 2   # 0.5 + 0.3 reaches 0.8
    assert sampling.TopP(0.81, seed=0).keep(PROBS) == 3
    assert sampling.MinP(0.3, seed=0).keep(PROBS) == 3   # >= 0.15
    for sampler in (sampling.TopK(2, seed=1), sampling.TopP(0.8, seed=1), sampling.MinP(0.5, seed=1)):
        assert {sampler.sample(IDS, PROBS) for _ in range(200)} == {7, 3}


def test_temperature_sampling_is_seeded_and_follows_the_distribution():
    first = sampling.Temperature(1.0, seed=5)
    again = sampling.Temperature(1.0, seed=5)
    assert [first.sample(IDS, PROBS) for _ in range(50)] == [again.sample(IDS, PROBS) for _ in range(50)]
    warm, cold_sampler = sampling.Temperature(1.0, seed=2), sampling.Temperature(0.1, seed=2)
    counts = Counter(warm.sample(IDS, PROBS) for _ in range(4000))
    assert abs(counts[7] / 4000 - 0.5) < 0.03 and abs(counts[1] / 4000 - 0.05) < 0.015
    cold = Counter(cold_sampler.sample(IDS, PROBS) for _ in range(500))
    assert cold[7] > 490  # (0.5/0.3)^10 = 165: nearly always the top token
    assert {sampling.Temperature(0.0, seed=3).sample(IDS, PROBS) for _ in range(50)} == {7}  # 0 is greedy
    with pytest.raises(ValueError, match="temperature must be >= 0"):
        sampling.Temperature(-1.0)
    with pytest.raises(ValueError, match=r"p must be in \(0, 1\]"):
        sampling.TopP(0.0)


# The test vectors of sdk/README.md ("Seeded sampling"); the Rust SDK's unit tests check the same.
VECTOR_PROBS = [struct.unpack("<f", struct.pack("<f", p))[0] for p in (0.4, 0.3, 0.15, 0.1, 0.05)]  # as f32


def test_the_generator_follows_the_shared_vectors():
    rng = sampling.Rng(1234567)
    assert [rng.next_u64() for _ in range(3)] == [6457827717110365317, 3203168211198807973, 9817491932198370423]
    rng = sampling.Rng(0)
    assert [rng.next_u64() for _ in range(3)] == [16294208416658607535, 7960286522194355700, 487617019471545679]
    rng = sampling.Rng(42)
    assert [rng.next_f64() for _ in range(3)] == [0.7415648787718233, 0.1599103928769201, 0.27860113025513866]
    assert sampling.Rng(-1).next_u64() == sampling.Rng(2**64 - 1).next_u64()  # seeds are taken mod 2**64


def spec_weight(x: float, a: float) -> float:
    """``weight(x, a)`` as sdk/README.md ("Seeded sampling") states it, loops and all."""
    if x >= 1.0:
        return 1.0
    if x < 2.0**-1022:
        return 0.0
    ln_terms = [1.0 / (2 * j + 1) for j in range(11)]
    exp_terms = [1.0]
    for j in range(1, 15):
        exp_terms.append(exp_terms[-1] / j)
    m, e = math.frexp(x)
    if m < 0.7071067811865476:
        m, e = m * 2.0, e - 1
    s = (m - 1.0) / (m + 1.0)
    z, poly = s * s, 0.0
    for term in reversed(ln_terms):
        poly = poly * z + term
    y = a * (e * 0.6931471805599453 + 2.0 * s * poly)
    if y < -708.0:
        return 0.0
    k = math.floor(y / 0.6931471805599453 + 0.5)
    r, q = y - k * 0.6931471805599453, 0.0
    for term in reversed(exp_terms):
        q = q * r + term
    return math.ldexp(q, k)


def test_weights_follow_the_spec_bit_for_bit():
    cases = [(0.5, 1 / 0.7), (0.1, 2.0), (0.999, 10.0), (1e-30, 0.5)]
    assert [sampling._weights([x], 1.0, a)[0].hex() for x, a in cases] == [
        "0x1.7c6a1f29e2ce6p-2", "0x1.47ae147ae147cp-7", "0x1.fae7299c256e3p-1", "0x1.203af9ee75620p-50"]
    assert sampling._weights([1.0, 0.0, 1e-300], 1.0, 10.0) == [1.0, 0.0, 0.0]  # 1e-300 ** 10 is below e**-708
    rng = random.Random(0)
    xs = [rng.random() ** rng.choice((1, 4, 16)) for _ in range(2000)]
    for a in (0.0, 0.3, 1 / 0.7, 2.5, 10.0):
        got = sampling._weights(xs, 1.0, a)
        assert got == [spec_weight(x, a) for x in xs]
        assert max(abs(w / x**a - 1) for w, x in zip(got, xs) if x**a > 1e-300) < 5e-13


@pytest.mark.parametrize("sampler, draws", [
    (lambda: sampling.Temperature(1.0, 7), "00311010010433313012"),
    (lambda: sampling.Temperature(0.7, 7), "00210000000332212011"),
    (lambda: sampling.TopK(3, 1.5, 7), "00211010000222212011"),
    (lambda: sampling.TopP(0.8, 0.7, 7), "00210000000222112011"),
    (lambda: sampling.MinP(0.3, 1.0, 7), "00210000000222212011"),
    (lambda: sampling.Temperature(0.0, 7), "00000000000000000000"),
], ids=["temperature-1", "temperature-0.7", "top-k", "top-p", "min-p", "temperature-0"])
def test_seeded_draws_follow_the_shared_vectors(sampler, draws):
    s = sampler()
    assert "".join(str(s.sample(list(range(5)), VECTOR_PROBS)) for _ in range(20)) == draws


def test_stop_conditions():
    s = stop.Stop(max_tokens=3, strings=("\n\n", "", "END"), tokens=(5,))
    assert s.strings == ("\n\n", "END")  # empty strings are ignored
    assert s.stop_token_ids(frozenset({2})) == {2, 5}
    assert stop.Stop(eos=False, tokens=(5,)).stop_token_ids(frozenset({2})) == {5}
    assert s.tail_tokens() == 4
    assert stop.Stop(strings=("né",)).tail_tokens() == 3  # characters, not bytes
    assert s.find_string("abc END x\n\n") == 4 and s.find_string("abc") is None
    with pytest.raises(TypeError, match="strings is a tuple of strings"):
        stop.Stop(strings="\n")


def table(handles: list[int]):
    t = pages.PageTable()
    for handle in handles:
        t.push(handle)
    return t


# The PageTable tests of the Rust crate (sdk/rust/oven/src/pages.rs), case for case.
def test_shared_pages_are_freed_by_the_last_holder():
    parent = table([1, 2, 3])
    child = parent.share_prefix(2)
    child.push(9)
    assert [parent.is_shared(i) for i in range(3)] == [True, True, False]
    assert parent.truncate(0) == [3]  # 1 and 2 are still the child's
    assert not child.is_shared(0)
    assert child.truncate(0) == [1, 2, 9]


def test_replacing_a_shared_page_keeps_it_for_the_other_holder():
    parent = table([1, 2])
    child = parent.share_prefix(2)
    assert parent.replace(1, 7) is None
    assert parent.handles == [1, 7]
    assert not child.is_shared(1)
    assert parent.replace(1, 8) == 7
    assert parent.truncate(5) == []


def test_exported_pages_stay_shared_but_are_freed_by_their_last_holder():
    parent = table([1, 2, 3])
    parent.mark_exported(2)
    child = parent.share_prefix(2)
    assert [parent.is_shared(i) for i in range(3)] == [True, True, False]
    assert parent.truncate(0) == [3]
    assert child.is_shared(0) and child.is_shared(1)  # still exported
    assert child.replace(1, 7) == 2  # our handle on the export is let go
    assert not child.is_shared(1)
    assert child.truncate(0) == [1, 7]


PROGRAMS = ["text-completion"]  # stored in the module's ControlLoop (the `loop` fixture, conftest.py)


def test_text_completion_equals_direct_greedy(loop, inference):
    (inst,) = run(loop, "text-completion", [["The quick brown fox", "12"]])
    assert inst.exit_code == 0, inst.error
    expected = direct_greedy(inference, loop, "The quick brown fox", 12)
    assert messages(loop, inst) == [" ".join(map(str, expected))]
    assert_pools_full(loop)


def test_chat_completion_uses_the_template(loop, inference):
    (inst,) = run(loop, "text-completion", [["Hi there", "8", "--chat"]])
    assert inst.exit_code == 0, inst.error
    prompt = Tokenizer(loop.info.tokenizer).render_chat([{"role": "user", "content": "Hi there"}], True)
    assert messages(loop, inst) == [" ".join(map(str, direct_greedy(inference, loop, prompt, 8)))]


def test_concurrent_completions_equal_solo_runs_and_seeded_sampling_repeats(loop, inference):
    prompts = [f"Item {i}: {'xy ' * i}" for i in range(12)]
    instances = run(loop, "text-completion", [[p, "7"] for p in prompts] +
                    [["Once upon", "9", "--temperature", "1.0", "--seed", "3"]] * 2)
    assert all(i.exit_code == 0 for i in instances), [i.error for i in instances]
    for inst, prompt in zip(instances, prompts):
        assert messages(loop, inst) == [" ".join(map(str, direct_greedy(inference, loop, prompt, 7)))]
    first, second = (messages(loop, i) for i in instances[-2:])
    assert first == second and len(first[0].split()) == 9
    assert events_of(loop, instances[0], "stdout")  # the completion is printed too
    assert_pools_full(loop)


def record_forwards(loop, monkeypatch) -> list[list[int]]:
    """The positions of every forward-text command the scheduler batches during the test."""
    positions, form = [], loop.replicas[0].scheduler.form_batch

    def recording(*args):
        batch = form(*args)
        if batch is not None and batch.call_type == "forward_text":
            positions.extend(list(command.item.positions) for command in batch.commands)
        return batch
    monkeypatch.setattr(loop.replicas[0].scheduler, "form_batch", recording)
    return positions


@pytest.mark.parametrize("prompt", ["The quick brown fox", "Once upon a time, in a land far away, there lived a"])
def test_flush_leaves_the_last_token_and_a_step_with_nothing_pending_feeds_it_again(loop, inference, monkeypatch,
                                                                                       prompt):
    num_prompt = len(Tokenizer(loop.info.tokenizer).encode(prompt))
    forwards = record_forwards(loop, monkeypatch)
    (inst,) = run(loop, "text-completion", [[prompt, "8", "--steps"]])
    assert inst.exit_code == 0, inst.error
    expected = direct_greedy(inference, loop, prompt, 8)
    assert messages(loop, inst) == [" ".join(map(str, expected))]
    # The flush: every prompt token but the last. Then per token two forwards of one token at the
    # same position: the pending one, then (nothing pending) the same one again.
    steps = range(num_prompt - 1, num_prompt - 1 + len(expected))
    assert forwards == [list(range(num_prompt - 1))] + [[position] for position in steps for _ in range(2)]
    assert_pools_full(loop)


def test_a_flush_of_one_token_forwards_nothing(loop, inference, monkeypatch):
    assert len(Tokenizer(loop.info.tokenizer).encode("Hi")) == 1
    forwards = record_forwards(loop, monkeypatch)
    (inst,) = run(loop, "text-completion", [["Hi", "3", "--steps"]])
    assert inst.exit_code == 0, inst.error
    expected = direct_greedy(inference, loop, "Hi", 3)
    assert messages(loop, inst) == [" ".join(map(str, expected))]
    assert forwards == [[position] for position in range(len(expected)) for _ in range(2)]


@pytest.mark.parametrize("mode", [[], ["--steps"]], ids=["generate", "steps"])
def test_decoding_an_empty_context_fails_clearly(loop, mode):
    (inst,) = run(loop, "text-completion", [["", "4", *mode]])
    assert inst.exit_code != 0 and "the context is empty: fill it before decoding" in inst.error
    assert_pools_full(loop)


def test_text_completion_refuses_bad_arguments(loop):
    cases = {("p", "many"): "argument MAX_NEW_TOKENS: expected a whole number >= 0, not 'many'",
             ("p", "--temperature", "-1"): "argument --temperature: expected a number >= 0, not '-1'",
             ("p", "--seed", "x"): "argument --seed: invalid int value: 'x'",
             ("p", "--steps", "--pause", "10"): "argument --pause: not allowed with argument --steps",
             ("p", "4", "5"): "unrecognized arguments: 5"}
    for stderr, error in zip(refused(loop, "text-completion", [list(args) for args in cases]), cases.values()):
        assert stderr.startswith("usage: text-completion [-h]")
        assert stderr.endswith(f"text-completion: error: {error}\n")

"""Token futures in the inference process (inference/token_futures.py, inference/sampling.py): a step
sampled there is the token the SDK's sampler draws from the distribution the inferlet would get, and
a pipelined sequence (every step sent before any reply is read) equals the step-by-step one."""

from __future__ import annotations

import pytest
from conftest import make_engine

from oven.client.generate import PagedSequence
from oven.inference.sampling import sdk
from oven.inference.validate import ItemFailure
from oven.proto import inference as p

GAMMA = 0x9E3779B97F4A7C15
PROMPT = [5, 17, 101, 44, 9, 250, 3]
PAGE = 16  # the engines' default page size

SAMPLERS = {  # wire spec -> (the SDK sampler the inferlet would run, top_k it would ask for)
    "greedy": (p.SampleSpec(0, p.SAMPLE_GREEDY), lambda: sdk.Greedy()),
    "temperature": (p.SampleSpec(0, p.SAMPLE_TEMPERATURE, 0.7, rng_state=11), lambda: sdk.Temperature(0.7, 11)),
    "top_k": (p.SampleSpec(0, p.SAMPLE_TOP_K, 1.5, 5, rng_state=12), lambda: sdk.TopK(5, 1.5, 12)),
    "top_p": (p.SampleSpec(0, p.SAMPLE_TOP_P, 0.8, 0.9, rng_state=13), lambda: sdk.TopP(0.9, 0.8, 13)),
    "min_p": (p.SampleSpec(0, p.SAMPLE_MIN_P, 1.0, 0.05, rng_state=14), lambda: sdk.MinP(0.05, 1.0, 14)),
}


@pytest.fixture(scope="module")
def engine():
    return make_engine("tiny")


def step_item(seq: PagedSequence, tokens: list[int], top_k: int, **extra) -> p.ForwardTextItem:
    pages, last_len = seq.extend(len(tokens))
    positions = list(range(seq.num_tokens - len(tokens), seq.num_tokens))
    return p.ForwardTextItem(tokens, positions, pages, last_len, [len(tokens) - 1], top_k, **extra)


def stepwise(call, make_sampler, num_steps: int, first_page: int = 0) -> list[int]:
    """The reference: every step's distribution comes back and the SDK sampler draws from it."""
    sampler, seq, out, inputs = make_sampler(), PagedSequence(PAGE, list(range(first_page, first_page + 8))), [], PROMPT
    for _ in range(num_steps):
        reply = call(p.ForwardTextRequest([step_item(seq, inputs, sampler.top_k)]))
        assert reply.errors == [None]
        dist = reply.dists[0][-1]
        out.append(sampler.sample(list(memoryview(dist.token_ids).cast("i")), list(memoryview(dist.probs).cast("f"))))
        inputs = [out[-1]]
    return out


def pipelined_requests(spec: p.SampleSpec, top_k: int, num_steps: int, first_page: int = 0,
                       first_slot: int = 0) -> list[p.ForwardTextRequest]:
    """All steps, built before any has run: step j reads slot j - 1 and samples into slot j, its
    generator state advanced by the draws before it (one per step, none for greedy)."""
    seq = PagedSequence(PAGE, list(range(first_page, first_page + 8)))
    draws = 0 if spec.kind == p.SAMPLE_GREEDY else 1
    requests = []
    for j in range(num_steps):
        sample = p.SampleSpec(first_slot + j, spec.kind, spec.temperature, spec.param,
                              (spec.rng_state + j * draws * GAMMA) % 2**64)
        if j == 0:
            item = step_item(seq, PROMPT, top_k, sample=sample)
        else:
            item = step_item(seq, [0], top_k, token_futures=[first_slot + j - 1], sample=sample)
        requests.append(p.ForwardTextRequest([item]))
    return requests


def test_the_generator_is_counter_based():
    rng = sdk.Rng(2**64 - 3)
    for k in range(1, 5):
        rng.next_u64()
        assert rng.state == (2**64 - 3 + k * GAMMA) % 2**64


@pytest.mark.parametrize("name", list(SAMPLERS))
def test_a_sampled_token_is_the_sdk_samplers_draw_on_the_returned_distribution(engine, name):
    spec, make_sampler = SAMPLERS[name]
    sampler = make_sampler()
    for j in range(6):  # successive draws of one sampler: slot j, state advanced as the SDK's
        seq = PagedSequence(PAGE, [40])
        tokens = [PROMPT[j], 7, 8 + j]
        spec_j = p.SampleSpec(100 + j, spec.kind, spec.temperature, spec.param, sampler.rng.state
                              if hasattr(sampler, "rng") else 0)
        reply = engine.handle(p.ForwardTextRequest([step_item(seq, tokens, sampler.top_k, sample=spec_j)]))
        assert reply.errors == [None]
        dist = reply.dists[0][-1]
        expected = sampler.sample(list(memoryview(dist.token_ids).cast("i")), list(memoryview(dist.probs).cast("f")))
        assert reply.sampled == [expected]
        assert engine.token_futures.token(100 + j) == expected


@pytest.mark.parametrize("name", ["greedy", "top_p"])
def test_pipelined_steps_equal_the_stepwise_ones(engine, name):
    spec, make_sampler = SAMPLERS[name]
    expected = stepwise(engine.handle, make_sampler, 12)
    replies = [engine.handle(r) for r in pipelined_requests(spec, make_sampler().top_k, 12, first_slot=200)]
    assert [r.errors for r in replies] == [[None]] * 12
    assert [r.sampled[0] for r in replies] == expected


def test_pipelined_greedy_on_smollm2_equals_stepwise():
    smol = make_engine("smollm2-135m-instruct", num_kv_pages=16)
    spec, make_sampler = SAMPLERS["greedy"]
    expected = stepwise(smol.handle, make_sampler, 10)
    replies = [smol.handle(r) for r in pipelined_requests(spec, 1, 10)]
    assert [r.sampled[0] for r in replies] == expected


def test_a_server_runs_steps_sent_before_any_reply(inference):
    """Through ZeroMQ: all requests go out first, then the replies are read, in order."""
    spec, make_sampler = SAMPLERS["top_p"]
    with inference.client() as client:
        expected = stepwise(client.call, make_sampler, 10)
        ids = [client.send(r) for r in pipelined_requests(spec, make_sampler().top_k, 10, first_slot=7)]
        replies = [client.wait(i) for i in ids]
        client.call(p.FreeFuturesRequest(list(range(7, 17))))
    assert [r.sampled[0] for r in replies] == expected


def test_a_bad_future_fails_its_item_alone(engine):
    ok = p.SampleSpec(300, p.SAMPLE_GREEDY)
    broken = p.ForwardTextItem([1], [0], [10**6], 1, [0], 1, sample=p.SampleSpec(301, p.SAMPLE_GREEDY))
    reply = engine.handle(p.ForwardTextRequest([step_item(PagedSequence(PAGE, [41]), [1, 2], 1, sample=ok), broken]))
    assert reply.errors[0] is None and reply.errors[1].code == p.ERR_BAD_PAGE
    engine.handle(p.FreeFuturesRequest([302]))

    def reader(slot: int, page: int) -> p.ForwardTextItem:
        return step_item(PagedSequence(PAGE, [page]), [0], 1, token_futures=[slot])

    reply = engine.handle(p.ForwardTextRequest([
        reader(300, 42), reader(301, 43), reader(302, 44),
        step_item(PagedSequence(PAGE, [45]), [3], 1, sample=p.SampleSpec(303, p.SAMPLE_GREEDY)), reader(303, 46)]))
    assert reply.errors[0] is None and reply.errors[3] is None
    assert reply.errors[1] == p.ItemError(p.ERR_BAD_FUTURE, "token future 301 failed: page 1000000 is out of "
                                                           "range [0, 64)")
    assert reply.errors[2] == p.ItemError(p.ERR_BAD_FUTURE, "token future 302 is free (never sampled, or freed)")
    assert reply.errors[4] == p.ItemError(p.ERR_BAD_FUTURE, "token future 303 is sampled by an item of the same "
                                                           "request: send its reader in a later one")
    engine.handle(p.FreeFuturesRequest([300]))
    reply = engine.handle(p.ForwardTextRequest([reader(300, 42)]))
    assert reply.errors == [p.ItemError(p.ERR_BAD_FUTURE, "token future 300 is free (never sampled, or freed)")]


def test_a_bad_sample_spec_is_refused(engine):
    seq = PagedSequence(PAGE, [47])
    reply = engine.handle(p.ForwardTextRequest([step_item(seq, [1], 0, sample=p.SampleSpec(310, "beam"))]))
    assert reply.errors == [p.ItemError(p.ERR_BAD_ARGUMENT, "sample: unknown sampler 'beam' (one of greedy, "
                                                            "temperature, top_k, top_p, min_p)")]
    reply = engine.handle(p.ForwardTextRequest([step_item(PagedSequence(PAGE, [47]), [1], 0,
                                                          sample=p.SampleSpec(311, p.SAMPLE_TOP_P, 1.0, 1.5))]))
    assert reply.errors == [p.ItemError(p.ERR_BAD_ARGUMENT, "sample: p must be in (0, 1]")]
    with pytest.raises(ItemFailure, match="token future 311 failed: sample: p must be in"):
        engine.token_futures.token(311)

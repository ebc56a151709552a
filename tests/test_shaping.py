"""Shaping in the inference process (inference/shaping.py, inference/decoders.py): a grammar's decoder
advanced by each drawn token while the next step is already sent (pipelined), masks and biases
composed with the SDK samplers, penalties, and log-probabilities against Hugging Face's."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from conftest import hf_reference, make_engine

from oven.client.generate import PagedSequence
from oven.inference.sampling import sdk
from oven.proto import grammar as g
from oven.proto import inference as p

PAGE = 16
SCHEMA = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 12},
                                           "age": {"type": "integer", "minimum": 0, "maximum": 150}},
          "required": ["name", "age"], "additionalProperties": False}


@pytest.fixture(scope="module")
def engine():
    return make_engine("smollm2-135m-instruct")


def prompt_ids(engine, text: str) -> list[int]:
    from tokenizers import Tokenizer
    return Tokenizer.from_str(engine.source.tokenizer.tokenizer_json).encode(text).ids


def item(seq: PagedSequence, tokens: list[int], sample: p.SampleSpec, futures: list[int] | None = None,
         top_k: int = 50) -> p.ForwardTextItem:
    pages, last_len = seq.extend(len(tokens))
    positions = list(range(seq.num_tokens - len(tokens), seq.num_tokens))
    return p.ForwardTextItem(tokens, positions, pages, last_len, [len(tokens) - 1], top_k, token_futures=futures,
                             sample=sample)


def pipelined(engine, prompt: list[int], steps: int, shape_of, kind=p.SAMPLE_GREEDY, first_page: int = 0):
    """Every step sent before the previous one's token is read: step k takes slot k-1 as its input."""
    seq = PagedSequence(PAGE, list(range(first_page, first_page + 16)))
    replies = [engine.handle(p.ForwardTextRequest([item(seq, prompt, p.SampleSpec(0, kind, shape=shape_of(0)))]))]
    for k in range(1, steps):
        sample = p.SampleSpec(k, kind, shape=shape_of(k))
        replies.append(engine.handle(p.ForwardTextRequest([item(seq, [0], sample, [k - 1])])))
    return replies


def decoder_shape(decoder_id: int, text: str, **extra):
    spec = p.DecoderSpec(g.grammar_text("json-schema", text) if text else "", **extra)
    return lambda k: p.ShapeSpec(decoder_id=decoder_id, decoder=spec if k == 0 else None)


def test_a_json_schema_decoder_is_followed_under_pipelined_decode(engine):
    import jsonschema
    prompt = prompt_ids(engine, "Give me a person as JSON:")
    replies = pipelined(engine, prompt, 40, decoder_shape(1, json.dumps(SCHEMA)))
    tokens = []
    for reply in replies:
        assert reply.errors == [None], reply.errors
        tokens.append(reply.sampled[0])
        if reply.sampled[0] in engine.source.tokenizer.stop_token_ids:
            break
    text = engine_detok(engine, tokens[:-1])
    jsonschema.validate(json.loads(text), SCHEMA)
    engine.handle(p.DropDecodersRequest([1]))


def engine_detok(engine, tokens):
    from tokenizers import Tokenizer
    return Tokenizer.from_str(engine.source.tokenizer.tokenizer_json).decode(tokens)


def test_greedy_under_a_grammar_equals_greedy_where_the_greedy_token_is_allowed(engine):
    """Shaping removes tokens, it never reorders the others: where the unshaped step's greedy token is
    allowed, the shaped step draws it."""
    prompt = prompt_ids(engine, "The answer is")
    allow = np.zeros(engine.limits.vocab_size, bool)
    plain = pipelined(engine, prompt, 6, lambda k: None)
    allow[[r.sampled[0] for r in plain]] = True
    allow[:1000] = True
    shaped = pipelined(engine, prompt, 6, lambda k: p.ShapeSpec(allowed=np.packbits(allow).tobytes()), first_page=16)
    assert [r.sampled[0] for r in shaped] == [r.sampled[0] for r in plain]
    # the distribution returned is the shaped one: nothing outside the mask
    ids = np.frombuffer(shaped[0].dists[0][-1].token_ids, "<i4")
    assert allow[ids].all() and len(ids) == 50


@pytest.mark.parametrize("kind", ["temperature", "top_k", "top_p", "min_p"])
def test_a_masked_draw_is_the_sdk_samplers_draw_from_the_masked_distribution(engine, kind):
    prompt = prompt_ids(engine, "Once upon a time")
    allow = np.zeros(engine.limits.vocab_size, bool)
    allow[1000:20000] = True
    bias_ids = np.array([1500, 1501], "<i4")
    bias_values = np.array([3.0, -np.inf], "<f4")
    shape = p.ShapeSpec(allowed=np.packbits(allow).tobytes(), bias_ids=bias_ids.tobytes(),
                        bias_values=bias_values.tobytes())
    spec = {"temperature": p.SampleSpec(0, kind, 0.9, rng_state=5, shape=shape),
            "top_k": p.SampleSpec(0, kind, 1.2, 7, rng_state=6, shape=shape),
            "top_p": p.SampleSpec(0, kind, 0.8, 0.9, rng_state=7, shape=shape),
            "min_p": p.SampleSpec(0, kind, 1.0, 0.05, rng_state=8, shape=shape)}[kind]
    seq = PagedSequence(PAGE, list(range(32, 40)))
    reply = engine.handle(p.ForwardTextRequest([item(seq, prompt, spec)]))
    dist = reply.dists[0][-1]
    ids, probs = np.frombuffer(dist.token_ids, "<i4").tolist(), np.frombuffer(dist.probs, "<f4").tolist()
    assert all(allow[i] for i in ids) and 1501 not in ids
    # the reference: the model's logits, shaped by hand, top 50, the SDK's sampler
    hf = hf_reference(engine)
    with torch.no_grad():
        logits = hf(torch.tensor([prompt])).logits[0, -1].float()
    logits[1500] += 3.0
    logits[1501] = -float("inf")
    logits[~torch.from_numpy(allow)] = -float("inf")
    top = torch.topk(logits, 50)
    assert ids == top.indices.tolist()
    ref = torch.exp(top.values - torch.logsumexp(logits, -1))
    assert np.allclose(probs, ref.numpy(), atol=1e-4)
    sampler = {"temperature": lambda: sdk.Temperature(0.9, 5), "top_k": lambda: sdk.TopK(7, 1.2, 6),
               "top_p": lambda: sdk.TopP(0.9, 0.8, 7), "min_p": lambda: sdk.MinP(0.05, 1.0, 8)}[kind]()
    assert reply.sampled[0] == sampler.sample(ids, probs)


def test_logprobs_are_hugging_faces_log_softmax(engine):
    prompt = prompt_ids(engine, "The capital of France is")
    seq = PagedSequence(PAGE, list(range(40, 44)))
    reply = engine.handle(p.ForwardTextRequest([item(seq, prompt, p.SampleSpec(0, p.SAMPLE_GREEDY,
                                                                               shape=p.ShapeSpec(logprobs=5)))]))
    hf = hf_reference(engine)
    with torch.no_grad():
        ref = torch.log_softmax(hf(torch.tensor([prompt])).logits[0, -1].float(), -1)
    lp = reply.logprobs[0]
    assert abs(lp.logprob - float(ref[reply.sampled[0]])) < 1e-4
    top = torch.topk(ref, 5)
    assert np.frombuffer(lp.top_ids, "<i4").tolist() == top.indices.tolist()
    assert np.allclose(np.frombuffer(lp.top_logprobs, "<f4"), top.values.numpy(), atol=1e-4)


def test_penalties_follow_the_tokens_drawn_under_the_decoder(engine):
    """Presence and frequency penalties kept by a decoder, pipelined, equal the same penalties given by
    hand as logit biases on each step once the tokens before it are known."""
    prompt = prompt_ids(engine, "1, 1, 1, 1, 1, 1,")
    plain = [r.sampled[0] for r in pipelined(engine, prompt, 12, lambda k: None, first_page=44)]
    shaped = [r.sampled[0] for r in pipelined(engine, prompt, 12, decoder_shape(2, "", frequency=2.0,
                                                                                 presence=1.5), first_page=44)]
    by_hand, seq, inputs = [], PagedSequence(PAGE, list(range(44, 48))), prompt
    for k in range(12):
        counts = {t: by_hand.count(t) for t in by_hand}
        ids = np.array(list(counts), "<i4")
        values = np.array([-(1.5 + 2.0 * c) for c in counts.values()], "<f4")
        shape = p.ShapeSpec(bias_ids=ids.tobytes(), bias_values=values.tobytes())
        reply = engine.handle(p.ForwardTextRequest([item(seq, inputs, p.SampleSpec(k, p.SAMPLE_GREEDY, shape=shape))]))
        by_hand.append(reply.sampled[0])
        inputs = [by_hand[-1]]
    assert shaped == by_hand and shaped != plain


def test_bad_shapes_fail_their_item_alone(engine):
    prompt = prompt_ids(engine, "Hi")
    seq = PagedSequence(PAGE, [60])
    good = item(PagedSequence(PAGE, [61]), prompt, p.SampleSpec(0, p.SAMPLE_GREEDY))
    bad = [
        p.ShapeSpec(allowed=b"\x00" * 3),
        p.ShapeSpec(allowed=bytes((engine.limits.vocab_size + 7) // 8)),  # nothing allowed
        p.ShapeSpec(decoder_id=9),  # unknown decoder, no spec
        p.ShapeSpec(bias_ids=np.array([10**7], "<i4").tobytes(), bias_values=np.array([1], "<f4").tobytes()),
        p.ShapeSpec(decoder_id=10, decoder=p.DecoderSpec(repetition=0.0)),
        p.ShapeSpec(logprobs=1000),
    ]
    for k, shape in enumerate(bad):
        seq = PagedSequence(PAGE, [62])
        reply = engine.handle(p.ForwardTextRequest([good, item(seq, prompt, p.SampleSpec(k + 1, p.SAMPLE_GREEDY,
                                                                                       shape=shape))]))
        assert reply.errors[0] is None and reply.errors[1] is not None, (k, reply.errors)
        good = item(PagedSequence(PAGE, [61]), prompt, p.SampleSpec(0, p.SAMPLE_GREEDY))


def test_grammar_masks_are_computed_beside_the_forward(engine, monkeypatch):
    """A batch's grammar masks are computed on the engine's mask worker, submitted before the model
    runs, the matchers advanced past the draws there too, and the draws are those of masks computed
    inline (in ``shape_row``)."""
    import threading

    from oven.inference import engine as engine_module

    calls = []
    real_masks, real_advance, real_run = engine_module.grammar_masks, engine_module.advance_matchers, engine._run

    def masks(*args):
        calls.append(("masks", threading.current_thread().name))
        return real_masks(*args)

    def advance(*args):
        calls.append(("advance", threading.current_thread().name))
        return real_advance(*args)

    def run(*args):
        calls.append(("run", threading.current_thread().name))
        return real_run(*args)

    def tokens(replies):
        assert all(r.errors == [None] for r in replies), [r.errors for r in replies]
        return [r.sampled[0] for r in replies]

    prompt = prompt_ids(engine, "Give me a person as JSON:")
    with monkeypatch.context() as inline:
        inline.setattr(engine, "masks_beside_forward", False)
        want = tokens(pipelined(engine, prompt, 12, decoder_shape(20, json.dumps(SCHEMA)), first_page=48))
    monkeypatch.setattr(engine_module, "grammar_masks", masks)
    monkeypatch.setattr(engine_module, "advance_matchers", advance)
    monkeypatch.setattr(engine, "_run", run)
    assert tokens(pipelined(engine, prompt, 12, decoder_shape(21, json.dumps(SCHEMA)), first_page=48)) == want
    engine._mask_worker.submit(lambda: None).result()  # the last draw's advance runs after its reply
    main = threading.current_thread().name
    assert sorted(kind for kind, _ in calls) == ["advance"] * 12 + ["masks"] * 12 + ["run"] * 12
    assert all(name == main if kind == "run" else name.startswith("grammar-masks") for kind, name in calls)
    engine.handle(p.DropDecodersRequest([20, 21]))

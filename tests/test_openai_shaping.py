"""What the OpenAI endpoint shapes, driven by the real ``openai`` client against ``oven serve`` on
SmolLM2: ``response_format`` (JSON Schema outputs validate, ``json_object`` parses), log-probabilities
(chat and completions, streamed or not), ``logit_bias``, the penalties, vLLM's ``top_k`` / ``min_p``,
``tool_choice`` over AsyncLM's CML, and a 400 naming the parameter for what cannot be served."""

from __future__ import annotations

import json
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

import jsonschema
import openai
import pytest
from schemas import FORMAT_CHECKER, SCHEMAS
from test_openai_tools import DEMO_TOOLS, smollm2_openai

from oven.control.tokenizer import Tokenizer

MODEL = "smollm2-135m-instruct"
SCHEMA_MAX_TOKENS = 120
PARALLEL = 8  # requests at once: their steps decode in one batch
# Every fourth schema of tests/schemas.py, each kind of schema there: test_constrained_schemas.py runs them
# all through the same grammar of the same server; this proves response_format reaches it.
OPENAI_SCHEMAS = SCHEMAS[::4]


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """(the openai client, the model's tokenizer)."""
    from oven.inference.models import resolve_model

    tokenizer = Tokenizer(resolve_model(MODEL, progress=lambda _: None).tokenizer)
    with smollm2_openai(tmp_path_factory.mktemp("smollm2")) as (api, _):
        yield api, tokenizer


@pytest.fixture(scope="module")
def api(served) -> openai.OpenAI:
    return served[0]


def chat(api: openai.OpenAI, content: str, **kwargs):
    return api.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": content}], **kwargs)


# -- response_format -----------------------------------------------------------------------------------

def test_json_schema_outputs_validate(api):
    """OPENAI_SCHEMAS, greedy: the reply ends by itself (not at max_tokens) and is JSON
    that validates, formats included where jsonschema checks them."""
    def ask(named):
        name, schema = named
        reply = chat(api, f"Give an example of {name.replace('_', ' ')} as JSON.", temperature=0,
                     max_tokens=SCHEMA_MAX_TOKENS,
                     response_format={"type": "json_schema", "json_schema": {"name": name, "schema": schema,
                                                                              "strict": True}})
        return reply.choices[0]

    started = time.monotonic()
    with ThreadPoolExecutor(PARALLEL) as pool:
        choices = list(pool.map(ask, OPENAI_SCHEMAS))
    elapsed = time.monotonic() - started
    print(f"\n{len(OPENAI_SCHEMAS)} json_schema requests in {elapsed:.1f} s")
    failures = []
    for (name, schema), choice in zip(OPENAI_SCHEMAS, choices):
        try:
            assert choice.finish_reason == "stop", f"ran to max_tokens: {choice.message.content!r}"
            jsonschema.validate(json.loads(choice.message.content), schema, format_checker=FORMAT_CHECKER)
        except (AssertionError, ValueError, jsonschema.ValidationError) as exc:
            failures.append(f"{name}: {str(exc).splitlines()[0]} in {choice.message.content!r}")
    assert not failures, "\n".join(failures)


def test_json_object_is_a_json_object_streamed_or_not(api):
    question = "Give me a JSON object with a cat's name and age."
    kwargs = dict(max_tokens=60, response_format={"type": "json_object"})
    chunks = list(chat(api, question, temperature=0, stream=True, **kwargs))
    texts = ["".join(c.choices[0].delta.content or "" for c in chunks if c.choices)]
    assert chunks[-1].choices[0].finish_reason == "stop"
    reply = chat(api, question, temperature=0.6, seed=3, n=2, **kwargs)  # each fork its own grammar state
    assert [c.finish_reason for c in reply.choices] == ["stop", "stop"]
    texts += [c.message.content for c in reply.choices]
    assert all(isinstance(json.loads(text), dict) for text in texts), texts


def test_text_response_format_is_plain_generation(api):
    plain = chat(api, "Name a colour.", temperature=0, max_tokens=8).choices[0].message.content
    text = chat(api, "Name a colour.", temperature=0, max_tokens=8, response_format={"type": "text"})
    assert text.choices[0].message.content == plain


@pytest.mark.parametrize("stream", [False, True])
def test_a_schema_that_cannot_be_compiled_is_a_400_naming_response_format(api, stream):
    schema = {"type": "object", "properties": {"code": {"type": "string", "pattern": "[unclosed"}}}
    with pytest.raises(openai.BadRequestError) as caught:
        chat(api, "Hi", max_tokens=8, stream=stream,
             response_format={"type": "json_schema", "json_schema": {"name": "bad", "schema": schema}})
    body = caught.value.body
    assert body["param"] == "response_format" and caught.value.status_code == 400
    assert body["message"].startswith("the response_format cannot be used: json-schema: "), body["message"]
    assert "\n" not in body["message"]


# -- log-probabilities ---------------------------------------------------------------------------------

def check_chat_logprobs(content: list, text: str, top: int) -> None:
    assert "".join(entry.token for entry in content) == text
    for entry in content:
        assert entry.logprob <= 0 and entry.bytes == list(entry.token.encode())
        assert len(entry.top_logprobs) == top
        logprobs = [t.logprob for t in entry.top_logprobs]
        assert logprobs == sorted(logprobs, reverse=True) and all(lp <= 0 for lp in logprobs)
        if top:  # greedy: the chosen token is the most probable
            assert entry.top_logprobs[0].token == entry.token
            assert entry.top_logprobs[0].logprob == pytest.approx(entry.logprob)


def test_chat_logprobs_streamed_or_not(api):
    reply = chat(api, "Name three colours.", temperature=0, max_tokens=12, logprobs=True, top_logprobs=3)
    (choice,) = reply.choices
    content = choice.logprobs.content
    assert len(content) == reply.usage.completion_tokens == 12  # no end token: it ran to max_tokens
    check_chat_logprobs(content, choice.message.content, 3)
    chunks = list(chat(api, "Name three colours.", temperature=0, max_tokens=12, logprobs=True, top_logprobs=3,
                       stream=True))
    streamed = [entry for c in chunks if c.choices and c.choices[0].logprobs for entry in c.choices[0].logprobs.content]
    assert [e.model_dump() for e in streamed] == [e.model_dump() for e in content]
    for c in chunks:  # each chunk's entries are its own text's tokens
        if c.choices and c.choices[0].logprobs:
            assert "".join(e.token for e in c.choices[0].logprobs.content) == c.choices[0].delta.content
    without_top = chat(api, "Name three colours.", temperature=0, max_tokens=12, logprobs=True).choices[0]
    check_chat_logprobs(without_top.logprobs.content, without_top.message.content, 0)
    assert chat(api, "Name three colours.", temperature=0, max_tokens=4).choices[0].logprobs is None


def test_chat_logprobs_leave_out_the_end_token_and_what_a_stop_string_cut(api):
    choice = chat(api, "Say OK.", temperature=0, max_tokens=40, logprobs=True, top_logprobs=1).choices[0]
    assert choice.finish_reason == "stop"
    check_chat_logprobs(choice.logprobs.content, choice.message.content, 1)
    full = chat(api, "Name three colours.", temperature=0, max_tokens=12).choices[0].message.content
    stop = full[len(full) // 2:len(full) // 2 + 2]
    cut = chat(api, "Name three colours.", temperature=0, max_tokens=12, stop=[stop], logprobs=True).choices[0]
    assert cut.message.content == full[:full.index(stop)]
    tokens = "".join(e.token for e in cut.logprobs.content)
    assert tokens.startswith(cut.message.content) and len(tokens) < len(full)


def test_sampled_logprobs_are_the_models_own(api):
    """At temperature 1, the chosen token need not be the most probable, but it is among the top 20
    with the logprob it is listed with there, if listed."""
    choice = chat(api, "Tell me a story.", temperature=1.0, seed=5, max_tokens=16, logprobs=True,
                  top_logprobs=20).choices[0]
    for entry in choice.logprobs.content:
        listed = {t.token: t.logprob for t in entry.top_logprobs}
        assert entry.logprob <= 0 and len(listed) <= 20
        if entry.token in listed:
            assert listed[entry.token] == pytest.approx(entry.logprob)


def test_completion_logprobs_streamed_or_not(api):
    prompt = "The capital of France is"
    reply = api.completions.create(model=MODEL, prompt=prompt, max_tokens=8, temperature=0, logprobs=2)
    (choice,) = reply.choices
    lp = choice.logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == len(lp.text_offset) == 8
    assert "".join(lp.tokens) == choice.text
    assert lp.text_offset == [sum(len(t) for t in lp.tokens[:i]) for i in range(8)]
    for token, logprob, top in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs):
        assert logprob <= 0 and len(top) <= 2 and max(top.values()) == pytest.approx(top[token])
        assert top[token] == pytest.approx(logprob)
    chunks = list(api.completions.create(model=MODEL, prompt=prompt, max_tokens=8, temperature=0, logprobs=2,
                                         stream=True))
    streamed = [c.choices[0].logprobs for c in chunks if c.choices[0].logprobs]
    assert sum((s.tokens for s in streamed), []) == lp.tokens
    assert sum((s.text_offset for s in streamed), []) == lp.text_offset
    zero = api.completions.create(model=MODEL, prompt=prompt, max_tokens=4, temperature=0, logprobs=0).choices[0]
    assert zero.logprobs.top_logprobs == [{}] * 4 and len(zero.logprobs.token_logprobs) == 4


# -- logit_bias, penalties, top_k, min_p ---------------------------------------------------------------

def first_token(api, tokenizer: Tokenizer, prompt: str, **kwargs) -> tuple[int, str]:
    text = chat(api, prompt, temperature=0, max_tokens=6, **kwargs).choices[0].message.content
    return tokenizer.encode(text)[0], text


def test_logit_bias_bans_and_forces_tokens(served):
    api, tokenizer = served
    prompt = "What is the capital of France?"
    token, text = first_token(api, tokenizer, prompt)
    banned, banned_text = first_token(api, tokenizer, prompt, logit_bias={str(token): -100})
    assert banned != token and banned_text != text
    forced = tokenizer.encode(" banana")[0]
    assert not text.startswith(tokenizer.decode([forced]))
    _, forced_text = first_token(api, tokenizer, prompt, logit_bias={str(forced): 100})
    assert forced_text == tokenizer.decode([forced]) * 6  # +100 at every step: it is drawn every time


def repetitive(api, **kwargs) -> list[str]:
    text = api.completions.create(model=MODEL, prompt="yes, yes, yes, yes, yes, yes,", max_tokens=24, temperature=0,
                                  **kwargs).choices[0].text
    return text.replace(",", " ").split()


def test_penalties_change_a_repetitive_greedy_output(api):
    plain = repetitive(api)
    assert plain == ["yes"] * 12, plain  # greedy, it goes on repeating
    for kwargs in (dict(frequency_penalty=2.0), dict(presence_penalty=2.0),
                   dict(extra_body={"repetition_penalty": 1.5})):
        shaped = repetitive(api, **kwargs)
        assert shaped.count("yes") < len(plain), (kwargs, shaped)


def test_top_k_1_and_min_p_1_are_greedy(api):
    greedy = chat(api, "Tell me a story.", temperature=0, max_tokens=16).choices[0].message.content
    for extra in ({"top_k": 1}, {"min_p": 1.0}):
        sampled = chat(api, "Tell me a story.", temperature=1.5, seed=9, max_tokens=16, extra_body=extra)
        assert sampled.choices[0].message.content == greedy, extra
    free = chat(api, "Tell me a story.", temperature=1.5, seed=9, max_tokens=16, extra_body={"top_k": -1})
    assert free.choices[0].message.content != greedy


# -- refusals ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("kwargs, param, message", [
    (dict(logprobs=True, top_logprobs=21), "top_logprobs", "top_logprobs must be from 0 to 20, not 21"),
    (dict(top_logprobs=2), "top_logprobs", "top_logprobs needs logprobs: true"),
    (dict(logit_bias={"17": 101}), "logit_bias", "logit_bias: the bias of token 17 must be a number from -100 to 100"),
    (dict(logit_bias={"hello": 1}), "logit_bias", "logit_bias: 'hello' is not a token id"),
    (dict(logit_bias={"49152": 5}), "logit_bias", "logit_bias: token 49152 is not in this model's vocabulary"),
    (dict(presence_penalty=2.5), "presence_penalty", "2.5 is not in [-2, 2] - 'presence_penalty'"),
    (dict(frequency_penalty=-3), "frequency_penalty", "-3.0 is not in [-2, 2] - 'frequency_penalty'"),
    (dict(extra_body={"top_k": -2}), "top_k", "top_k must be -1 or 0 (off) or at least 1, not -2"),
    (dict(extra_body={"min_p": 1.5}), "min_p", "1.5 is not in [0, 1] - 'min_p'"),
    (dict(extra_body={"min_p": 0.1}, top_p=0.9), "min_p", "min_p and top_p cannot be combined here"),
    (dict(extra_body={"repetition_penalty": 0}), "repetition_penalty", "0.0 is not in (0, inf) - 'repetition_penalty'"),
    (dict(response_format={"type": "yaml"}), "response_format", "'response_format' must be"),
    (dict(response_format={"type": "json_schema", "json_schema": {"schema": {}}}), "response_format.json_schema.name",
     "'response_format.json_schema.name' must be"),
    (dict(response_format={"type": "json_schema", "json_schema": {"name": "no", "schema": False}}), "response_format",
     "'response_format.json_schema.schema' is false, which no output satisfies"),
    (dict(extra_body={"echo": True}), "echo", "'echo' is not supported by this server (only false)"),
])
def test_out_of_range_values_are_a_400_naming_them(api, kwargs, param, message):
    with pytest.raises(openai.BadRequestError) as caught:
        chat(api, "Hi", max_tokens=4, **kwargs)
    assert caught.value.body["param"] == param
    assert caught.value.body["message"].startswith(message), caught.value.body["message"]


def test_completion_logprobs_past_5_are_a_400(api):
    with pytest.raises(openai.BadRequestError) as caught:
        api.completions.create(model=MODEL, prompt="Hi", max_tokens=2, logprobs=6)
    assert caught.value.body["param"] == "logprobs"


# -- tool_choice over AsyncLM's CML --------------------------------------------------------------------

def ask_tools(api, content: str, **kwargs):
    return chat(api, content, tools=DEMO_TOOLS, temperature=0, max_tokens=120, **kwargs).choices[0]


def test_tool_choice_none_required_and_named(api):
    """Greedy on the committed adapter: asked for two things, the model calls both tools (auto); to a
    thank-you it answers in words. tool_choice holds it to words, or to calls (of one function), one
    call alone without parallel_tool_calls."""
    question, thanks = "What is the weather in Paris and the price of AAPL?", "Thanks, that is all."
    weather = {"type": "function", "function": {"name": "get_weather"}}
    cases = {"auto": (question, {}), "none": (question, dict(tool_choice="none")), "thanks": (thanks, {}),
             "required": (thanks, dict(tool_choice="required")), "named": (question, dict(tool_choice=weather)),
             "single": (question, dict(parallel_tool_calls=False)),
             "single_required": (thanks, dict(tool_choice="required", parallel_tool_calls=False))}
    with ThreadPoolExecutor(len(cases)) as pool:
        replies = dict(zip(cases, pool.map(lambda case: ask_tools(api, case[0], **case[1]), cases.values())))
    assert replies["auto"].finish_reason == "tool_calls" and len(replies["auto"].message.tool_calls) == 2
    none = replies["none"]
    assert none.message.tool_calls is None and "[CALL]" not in none.message.content
    assert none.finish_reason in ("stop", "length")
    assert replies["thanks"].message.tool_calls is None
    required = replies["required"]
    assert required.finish_reason == "tool_calls" and required.message.tool_calls
    for call in required.message.tool_calls:
        schema = next(t["function"]["parameters"] for t in DEMO_TOOLS if t["function"]["name"] == call.function.name)
        jsonschema.validate(json.loads(call.function.arguments), schema)
    named = replies["named"].message.tool_calls
    assert named and {c.function.name for c in named} == {"get_weather"}
    assert replies["single"].finish_reason == "tool_calls" and len(replies["single"].message.tool_calls) == 1
    assert len(replies["single_required"].message.tool_calls) == 1

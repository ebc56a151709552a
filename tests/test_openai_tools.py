"""OpenAI tool calls as AsyncLM's CML (client/openai_api/tools.py): a conversation with tools becomes
AsyncLM's system prompt and an open assistant turn of calls and interrupts; what the model writes
up to its trap becomes ``tool_calls``. No server: the request checking and the two translations."""

from __future__ import annotations

import json
import re
import time
from contextlib import contextmanager

import pytest

from oven.client.asynclm.training.protocol import prompt as asynclm_prompt
from oven.client.openai_api.errors import ApiError
from oven.client.openai_api.requests import parse_job
from oven.client.openai_api.tools import ADAPTER, parse_reply

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The current weather of a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "unit": {"type": "string"}},
                   "required": ["city"]}}}
CALL = {"id": "w1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}}


def job(messages: list[dict], **extra):
    return parse_job({"model": "m", "messages": messages, "tools": [WEATHER], **extra}, chat=True)


def test_a_first_request_is_asynclms_prompt_with_the_clients_system_text_after_it():
    j = job([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Weather in Oslo?"}])
    functions = "- get_weather(city: str, unit: str = None): The current weather of a city. " \
                "(estimated execution time: 100 ms)"
    assert j.messages == ({"role": "system", "content": asynclm_prompt().system_prompt(functions) + "\n\nBe brief."},
                          {"role": "user", "content": "Weather in Oslo?"})
    assert j.prefix == j.results == ()
    body = json.loads(j.inferlet_request())
    assert (body["adapter"], body["prefix"], body["results"], body["wait"], body["stop"], body["stream"]) == (
        ADAPTER, [], [], "[TRAP][END]", [], False)


def test_calls_and_results_are_the_open_assistant_turn_and_later_results_wait_their_turn():
    j = job([{"role": "user", "content": "Weather in Oslo and Rome?"},
             {"role": "assistant", "content": None, "tool_calls": [CALL, {**CALL, "id": "w2", "function": {
                 "name": "get_weather", "arguments": '{"city": "Rome"}'}}]},
             {"role": "tool", "tool_call_id": "w1", "content": '{"temp_c": 4,\n "sky": "rain"}'},
             {"role": "tool", "tool_call_id": "w2", "content": "20 C"}])
    assert [m["role"] for m in j.messages] == ["system", "user"]
    assert j.prefix == ('[CALL] w1 [HEAD] get_weather(city=" Oslo") [END]\n'  # what the model wrote ...
                        '[CALL] w2 [HEAD] get_weather(city=" Rome") [END]\n[TRAP][END]',
                        '[INTR] w1 [HEAD] {"temp_c": 4, "sky": "rain"} [END]\n')  # ... its first result alone
    assert j.results == ("[INTR] w2 [HEAD] 20 C [END]\n",)  # given at its next [TRAP][END]


def test_an_earlier_turn_with_calls_is_one_assistant_message():
    j = job([{"role": "user", "content": "Weather in Oslo?"},
             {"role": "assistant", "content": "Let me look.", "tool_calls": [CALL]},
             {"role": "tool", "tool_call_id": "w1", "content": "4 C"},
             {"role": "assistant", "content": "It is 4 C."},
             {"role": "user", "content": "Thanks!"}])
    assert j.messages[1:] == (
        {"role": "user", "content": "Weather in Oslo?"},
        {"role": "assistant", "content": 'Let me look.\n[CALL] w1 [HEAD] get_weather(city=" Oslo") [END]\n'
                                         "[TRAP][END][INTR] w1 [HEAD] 4 C [END]\nIt is 4 C."},
        {"role": "user", "content": "Thanks!"})
    assert j.prefix == j.results == ()


@pytest.mark.parametrize("body, param, message", [
    ({"tools": [{"type": "function", "function": {"name": "get-weather"}}]}, "tools[0].function.name",
     "must be a name of letters, digits and underscores"),
    ({"tools": [WEATHER, WEATHER]}, "tools[1].function.name", "'get_weather' is already a tool"),
    ({"tools": [{"type": "code_interpreter"}]}, "tools[0]", 'a tool is {"type": "function"'),
    ({"tools": [WEATHER], "tool_choice": "sometimes"}, "tool_choice", "tool_choice must be 'none', 'auto', 'required'"),
    ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "nope"}}},
     "tool_choice.function.name", "tool_choice names 'nope', which is not one of the request's tools"),
    ({"tool_choice": "required"}, "tool_choice", "tool_choice 'required' or a function needs the request's 'tools'"),
    ({"tools": [WEATHER], "logprobs": True}, "logprobs", "logprobs are not given with tools here"),
    ({"tools": [WEATHER], "response_format": {"type": "json_object"}}, "response_format",
     "a JSON response_format is not supported together with tools here"),
    ({"functions": [WEATHER["function"]]}, "functions", "'functions' is deprecated by OpenAI"),
    ({"tools": [WEATHER], "messages": [{"role": "user", "content": "x"},
                                       {"role": "tool", "tool_call_id": "zz", "content": "1"}]},
     "messages[1].tool_call_id", "'zz' answers no tool call of the assistant message before it"),
    ({"tools": [WEATHER], "messages": [{"role": "assistant", "content": None, "tool_calls": [
        {**CALL, "function": {"name": "get_weather", "arguments": "[1]"}}]}]},
     "messages[0].tool_calls[0].function.arguments", "must be a JSON object of Python names"),
    ({"messages": [{"role": "assistant", "content": None, "tool_calls": [CALL]}]}, "messages[0].tool_calls",
     "tool calls and results need the request's 'tools'"),
])
def test_bad_tool_requests_get_400_naming_the_parameter(body, param, message):
    with pytest.raises(ApiError, match=re.escape(message)) as error:
        parse_job({"model": "m", "messages": [{"role": "user", "content": "x"}], **body}, chat=True)
    assert (error.value.status, error.value.param) == (400, param)


def test_the_calls_the_model_wrote_become_tool_calls_and_the_rest_its_content():
    tools = job([{"role": "user", "content": "x"}]).tools
    content, calls = parse_reply('Checking. [CALL] w1 [HEAD] get_weather(city="Oslo") [END]\n'
                                 '[CALL] w2 [HEAD] get_weather("Rome", unit="C") [END]\n'
                                 '[CALL] s1 [HEAD] get_stock("X") [END]\n', tools)
    assert calls == [
        {"id": "w1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}},
        {"id": "w2", "type": "function", "function": {"name": "get_weather",
                                                      "arguments": '{"city": "Rome", "unit": "C"}'}}]
    assert content == 'Checking. \n\n[CALL] s1 [HEAD] get_stock("X") [END]'  # not a tool: kept as written
    assert parse_reply("It is 4 C in Oslo.", tools) == ("It is 4 C in Oslo.", [])


# -- end to end: the real openai client, SmolLM2 on the packaged asynclm adapter --------------------------

@contextmanager
def smollm2_openai(root):
    """``oven serve`` of SmolLM2 (with the packaged asynclm adapter) and its OpenAI API: (the real
    ``openai`` client, the harness's Server)."""
    import openai
    from harness import PROGRAM_DIR, Server
    from test_openai_api import free_port, http

    port = free_port()
    server = Server(root, "--program-dir", PROGRAM_DIR, "--openai-port", str(port), model="smollm2-135m-instruct")
    try:
        url, deadline = f"http://127.0.0.1:{port}/v1", time.monotonic() + 120
        while True:
            try:
                if http("GET", f"{url}/models", key=server.operator_token)[0] == 200:
                    break
            except OSError:  # not listening yet
                pass
            assert time.monotonic() < deadline, "the OpenAI API did not come up"
            time.sleep(0.5)
        yield openai.OpenAI(base_url=url, api_key=server.operator_token, max_retries=0), server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def smollm2_api(tmp_path_factory):
    with smollm2_openai(tmp_path_factory.mktemp("smollm2")) as (api, _):
        yield api


DEMO_TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Get the current weather of a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}},
    {"type": "function", "function": {
        "name": "get_stock_price", "description": "Get the current price of a stock.",
        "parameters": {"type": "object", "properties": {"symbol": {"type": "string"}}, "required": ["symbol"]}}}]


def test_the_model_calls_tools_and_answers_from_their_results(smollm2_api):
    """Greedy, so exact (the committed adapter's outputs: a retrained one may need these updated): it
    writes both calls of the question at once (one reply, finish reason tool_calls); given their
    results back, one per wait, it states Paris's weather in its answer."""
    question = [{"role": "user", "content": "What is the weather in Paris and the price of AAPL?"}]
    ask = lambda messages: smollm2_api.chat.completions.create(  # noqa: E731
        model="smollm2-135m-instruct", messages=messages, tools=DEMO_TOOLS, temperature=0, max_tokens=120)
    first = ask(question).choices[0]
    assert first.finish_reason == "tool_calls" and first.message.content is None
    assert [(c.id, c.function.name, json.loads(c.function.arguments)) for c in first.message.tool_calls] == [
        ("t1", "get_stock_price", {"symbol": "AAPL"}), ("t2", "get_weather", {"city": "Paris"})]
    results = {"t1": {"symbol": "AAPL", "price_usd": 231.5},
               "t2": {"city": "Paris", "temperature_c": 18, "conditions": "sunny", "humidity_percent": 40}}
    messages = [*question, first.message.model_dump(exclude_none=True),
                *({"role": "tool", "tool_call_id": i, "content": json.dumps(v)} for i, v in results.items())]
    second = ask(messages).choices[0]
    assert "18" in second.message.content and "Paris" in second.message.content
    streamed = smollm2_api.chat.completions.create(model="smollm2-135m-instruct", messages=messages,
                                                   tools=DEMO_TOOLS, temperature=0, max_tokens=120, stream=True)
    deltas = [chunk.choices[0] for chunk in streamed if chunk.choices]
    assert "".join(d.delta.content or "" for d in deltas) == second.message.content
    assert deltas[-1].finish_reason == second.finish_reason

"""OpenAI tool calls as AsyncLM's CML (client/openai_api/tools.py): a conversation with tools becomes
AsyncLM's system prompt and an open assistant turn of calls and interrupts; what the model writes
up to its trap becomes ``tool_calls``. No server: the request checking and the two translations."""

from __future__ import annotations

import json

import pytest

from oven.client.asynclm.training.protocol import prompt as asynclm_prompt
from oven.client.openai_api.errors import ApiError
from oven.client.openai_api.requests import parse_job
from oven.client.openai_api.tools import ADAPTER, STOP, parse_reply

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
    assert j.prefix == ""
    body = json.loads(j.inferlet_request())
    assert (body["adapter"], body["prefix"], body["stop"]) == (ADAPTER, "", [STOP])


def test_calls_and_results_are_the_open_assistant_turn():
    j = job([{"role": "user", "content": "Weather in Oslo?"},
             {"role": "assistant", "content": None, "tool_calls": [CALL]},
             {"role": "tool", "tool_call_id": "w1", "content": '{"temp_c": 4,\n "sky": "rain"}'}])
    assert [m["role"] for m in j.messages] == ["system", "user"]
    assert j.prefix == ("[CALL] w1 [HEAD] get_weather(city='Oslo') [END]\n[TRAP][END]\n"
                        '[INTR] w1 [HEAD] {"temp_c": 4, "sky": "rain"} [END]\n')


def test_an_earlier_turn_with_calls_is_one_assistant_message():
    j = job([{"role": "user", "content": "Weather in Oslo?"},
             {"role": "assistant", "content": "Let me look.", "tool_calls": [CALL]},
             {"role": "tool", "tool_call_id": "w1", "content": "4 C"},
             {"role": "assistant", "content": "It is 4 C."},
             {"role": "user", "content": "Thanks!"}])
    assert j.messages[1:] == (
        {"role": "user", "content": "Weather in Oslo?"},
        {"role": "assistant", "content": "Let me look.\n[CALL] w1 [HEAD] get_weather(city='Oslo') [END]\n"
                                         "[TRAP][END]\n[INTR] w1 [HEAD] 4 C [END]\nIt is 4 C."},
        {"role": "user", "content": "Thanks!"})
    assert j.prefix == ""


@pytest.mark.parametrize("body, param, message", [
    ({"tools": [{"type": "function", "function": {"name": "get-weather"}}]}, "tools[0].function.name",
     "must be a name of letters, digits and underscores"),
    ({"tools": [WEATHER, WEATHER]}, "tools[1].function.name", "'get_weather' is already a tool"),
    ({"tools": [{"type": "code_interpreter"}]}, "tools[0]", 'a tool is {"type": "function"'),
    ({"tools": [WEATHER], "tool_choice": "required"}, "tool_choice", "only tool_choice 'auto' is supported"),
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
    with pytest.raises(ApiError) as error:
        parse_job({"model": "m", "messages": [{"role": "user", "content": "x"}], **body}, chat=True)
    assert (error.value.status, error.value.param) == (400, param)
    assert message in error.value.message


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

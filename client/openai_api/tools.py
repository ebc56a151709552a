"""OpenAI tool calls on AsyncLM's CML: what the fine-tuned model writes is what a client's
``tools`` become, and back.

A request with ``tools`` runs on the ``asynclm`` LoRA adapter with AsyncLM's system prompt (the
inferlet's own ``prompt.py``: the CML rules, then one line per function, its signature from the
JSON schema), so the model sees the text it was trained on. The conversation so far is one open
assistant turn: each earlier ``tool_calls`` message is its ``[CALL] id [HEAD] f(args) [END]``
lines and a ``[TRAP][END]`` (the model waits for them); each ``tool`` message is the interrupt
``[INTR] id [HEAD] result [END]`` of its call, given one per wait as in training: the inferlet
fills the first, and each further one when the model writes ``[TRAP][END]`` again (having stated
what it got). The model goes on writing and is stopped at a wait with no result left to give.
The calls it wrote become the reply's ``tool_calls`` (ids are the model's own CML ids, arguments
bound to the schema's parameters, as JSON), the rest of its text the message's content. OpenAI's
client runs the calls and sends their results back: a call's result reaches the model as the
interrupt it was trained on, one request later.
"""

from __future__ import annotations

import json
import re

from ..asynclm.tools.call import ToolError, parse_call, spaced_call
from ..asynclm.tools.call_grammar import function_rules, literal as _literal
from ..asynclm.tools.registry import describe_line
from ..asynclm.tools.schema import schema_signature, schema_tool_text
from ..asynclm.training.protocol import prompt as asynclm_prompt
from .errors import bad_request

ADAPTER = "asynclm"  # the LoRA adapter that writes CML (client/asynclm/adapter, offered by oven serve)
MAX_TOOLS = 64
ESTIMATE_MS = 100  # the prompt states each function's expected time; OpenAI's tools carry none
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,63}")
_CALL = re.compile(r"\[CALL\]\s*(\S+?)\s*\[HEAD\]\s*(.*?)\s*\[END\]", re.S)


def check_tools(value) -> tuple[dict, ...]:
    """The request's ``tools``, checked: ``({"name", "description", "parameters"}, ...)``."""
    if not isinstance(value, list) or not value:
        raise bad_request("'tools' must be a non-empty list of tools", "tools", "invalid_type")
    if len(value) > MAX_TOOLS:
        raise bad_request(f"'tools' holds at most {MAX_TOOLS} tools", "tools")
    tools, names = [], set()
    for i, tool in enumerate(value):
        where = f"tools[{i}]"
        function = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(tool, dict) or tool.get("type") != "function" or not isinstance(function, dict):
            raise bad_request(f"{where}: a tool is {{\"type\": \"function\", \"function\": {{...}}}}", where,
                              "invalid_type")
        name = function.get("name")
        if not isinstance(name, str) or not _NAME.fullmatch(name):
            raise bad_request(f"{where}.function.name must be a name of letters, digits and underscores "
                              f"(a Python name: the model writes calls in Python syntax), not {name!r}",
                              f"{where}.function.name")
        if name in names:
            raise bad_request(f"{where}.function.name: {name!r} is already a tool", f"{where}.function.name")
        parameters = function.get("parameters", {"type": "object", "properties": {}})
        properties = parameters.get("properties", {}) if isinstance(parameters, dict) else None
        if not isinstance(properties, dict) or not all(_NAME.fullmatch(p) for p in properties):
            raise bad_request(f"{where}.function.parameters must be a JSON schema object whose properties are "
                              "Python names", f"{where}.function.parameters")
        description = function.get("description", "")
        if not isinstance(description, str):
            raise bad_request(f"{where}.function.description must be a string", f"{where}.function.description",
                              "invalid_type")
        names.add(name)
        tools.append({"name": name, "description": description, "parameters": parameters})
    return tuple(tools)


def system_prompt(tools: tuple[dict, ...], extra: str = "") -> str:
    """AsyncLM's system prompt for ``tools``; a client's own system messages (``extra``) follow it."""
    functions = "\n".join(describe_line(*schema_tool_text(tool), ESTIMATE_MS) for tool in tools)
    text = asynclm_prompt().system_prompt(functions)
    return f"{text}\n\n{extra}" if extra else text


def call_text(tool_call: dict, where: str) -> tuple[str, str]:
    """An OpenAI ``tool_calls`` entry as ``(id, "f(a=1)")``; 400 if it is not one."""
    function = tool_call.get("function") if isinstance(tool_call, dict) else None
    if not isinstance(function, dict) or not isinstance(function.get("name"), str) \
            or not _NAME.fullmatch(function["name"]):
        raise bad_request(f"{where}: a tool call is {{\"id\", \"type\": \"function\", \"function\": {{\"name\", "
                          "\"arguments\"}}}}", where, "invalid_type")
    call_id = tool_call.get("id")
    if not isinstance(call_id, str) or not call_id.strip() or any(c.isspace() or c in "[]" for c in call_id):
        raise bad_request(f"{where}.id must be a string without spaces or brackets", f"{where}.id")
    try:
        arguments = json.loads(function.get("arguments") or "{}")
    except ValueError:
        raise bad_request(f"{where}.function.arguments must be a JSON object", f"{where}.function.arguments") \
            from None
    if not isinstance(arguments, dict) or not all(isinstance(k, str) and _NAME.fullmatch(k) for k in arguments):
        raise bad_request(f"{where}.function.arguments must be a JSON object of Python names",
                          f"{where}.function.arguments")
    text = f"{function['name']}({', '.join(f'{k}={_literal(v)}' for k, v in arguments.items())})"
    try:
        return call_id, spaced_call(text)
    except ToolError:  # a keyword as an argument name: not a call the model could have written; kept as sent
        return call_id, text


def trap_text() -> str:
    """The wait as the model writes it: ``[TRAP][END]``, the interrupt right after its ``[END]`` (the
    newline of the inferlet's ``TRAP_TEXT`` is never written in training: the result comes first)."""
    return asynclm_prompt().TRAP_TEXT.rstrip("\n")


def calls_turn(calls: list[tuple[str, str]]) -> str:
    """An assistant's ``tool_calls`` as it wrote them: its calls, then the wait."""
    cml = asynclm_prompt()
    return "".join(cml.call_text(call_id, call) for call_id, call in calls) + trap_text()


def result_turn(call_id: str, content: str) -> str:
    """A ``tool`` message as the interrupt of its call."""
    return asynclm_prompt().interrupt_text(call_id, " ".join(content.split()))


def parse_reply(text: str, tools: tuple[dict, ...]) -> tuple[str, list[dict]]:
    """What the model wrote up to its trap: ``(content, tool_calls)``.

    A block that is not a call of one of ``tools`` with arguments its schema allows stays in the
    content as written (the client sees what the model did, nothing is dropped)."""
    known = {tool["name"]: tool for tool in tools}
    calls, kept, last = [], [], 0
    for match in _CALL.finditer(text):
        call = _tool_call(match.group(1), match.group(2), known)
        if call is None:
            continue
        kept.append(text[last:match.start()])
        last = match.end()
        calls.append(call)
    kept.append(text[last:])
    content = "".join(kept).strip()
    return content, calls


def _tool_call(call_id: str, text: str, known: dict[str, dict]) -> dict | None:
    try:
        call = parse_call(text)
        tool = known[call.name]
        arguments = dict(schema_signature(tool).bind(*call.args, **call.kwargs).arguments)  # positional: schema order
    except (ToolError, KeyError, TypeError):
        return None
    return {"id": call_id, "type": "function",
            "function": {"name": call.name, "arguments": json.dumps(arguments, ensure_ascii=False)}}


# -- tool_choice: a grammar over what the model writes ------------------------------------------------

# Any text in which "[CALL]" never appears: the automaton of that one word, written out as a regex (a
# complement, ~/.*\[CALL\].*/, lets llguidance's lexer walk into a dead end it cannot leave). A return
# to the start is a character that is not "[", or "[" and what follows it up to the first character
# that leaves the word (each "[" on the way begins it again); the text may end inside the word.
_RESTART = r"(?:(?:C(?:A(?:LL?)?)?)?\[)*"
_LEAVE = r"(?:[^\[C]|C[^\[A]|CA[^\[L]|CAL[^\[L]|CALL[^\[\]])"
NO_CALL_REGEX = rf"(?:[^\[]|\[{_RESTART}{_LEAVE})*(?:\[{_RESTART}(?:C(?:A(?:LL?)?)?)?)?"
MAX_ID_CHARS = 16  # a call id the model writes under a grammar: a Python name this long at most


def choice_grammar(choice, tools: tuple[dict, ...], parallel: bool = True) -> tuple[tuple[str, str], str, str] | None:
    """``tool_choice`` as a grammar over the model's CML: ``((kind, spec), "tool_choice", stretches)``,
    or None for ``auto``.

    ``none``: any text without ``[CALL]``, in every stretch of the turn. ``required``: calls of
    ``tools`` and then the wait, nothing else; a function (``{"type": "function", "function":
    {"name": ...}}``): calls of it alone. Those two hold the last stretch (once the turn's results
    are all given: an earlier stretch only waits for the next one). Each call's arguments are
    keyword arguments in the model's style (``f(city=" Paris", n=2)``), of its schema's names and
    types (``call_grammar``). ``parallel`` false (``parallel_tool_calls``): one call."""
    if choice in (None, "auto"):
        return None
    if choice == "none":
        return ("regex", NO_CALL_REGEX), "tool_choice", "all"
    if choice == "required":
        chosen = tools
    elif isinstance(choice, dict) and choice.get("type") == "function" and isinstance(choice.get("function"), dict):
        name = choice["function"].get("name")
        chosen = tuple(tool for tool in tools if tool["name"] == name)
        if not chosen:
            raise bad_request(f"tool_choice names {name!r}, which is not one of the request's tools",
                              "tool_choice.function.name")
    else:
        raise bad_request("tool_choice must be 'none', 'auto', 'required' or {\"type\": \"function\", "
                          "\"function\": {\"name\": ...}}", "tool_choice", "invalid_type")
    return ("lark", calls_grammar(chosen, parallel)), "tool_choice", "last"


def calls_grammar(tools: tuple[dict, ...], parallel: bool = True) -> str:
    """A Lark grammar: one call of ``tools`` or more (one alone unless ``parallel``), then the wait
    (each call as :mod:`~oven.client.asynclm.tools.call_grammar` holds it)."""
    trap = json.dumps(trap_text())
    names, rules = function_rules(list(tools))
    return "\n".join([f"start: call{'+' if parallel else ''} {trap}",
                      f"call: \"[CALL] \" ID \" [HEAD] \" ({' | '.join(names)}) \" [END]\\n\"", *rules,
                      f"ID: /[A-Za-z_][A-Za-z0-9_]{{0,{MAX_ID_CHARS - 1}}}/"])

"""Checking the JSON body of a Chat Completions or Completions request into a :class:`Job`.

What the chat-completion inferlet can do is accepted; a parameter it cannot honour fails with a
400 naming it, never silently ignored (``logprobs``, penalties, ``functions``, ...). Parameters that
change nothing here (``user``, ``metadata``, ``store``, ...) are accepted and ignored. ``tools``
run on AsyncLM's CML (:mod:`.tools`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from . import tools as cml_tools
from .errors import bad_request

CHAT_MAX_TOKENS = 512  # OpenAI's chat default is "until the model stops"; oven's, this many
COMPLETION_MAX_TOKENS = 16  # OpenAI's documented default for /v1/completions
MAX_N = 16
MAX_STOPS = 4
IGNORED = {"user", "metadata", "store", "service_tier", "parallel_tool_calls", "modalities", "prediction",
           "reasoning_effort", "verbosity", "prompt_cache_key", "safety_identifier", "response_format"}
# Accepted only at the value that means "off".
NEUTRAL = {"presence_penalty": 0, "frequency_penalty": 0, "logprobs": False, "top_logprobs": 0, "echo": False,
           "best_of": 1, "logit_bias": {}, "suffix": None}
COMMON = {"model", "max_tokens", "temperature", "top_p", "seed", "stop", "n", "stream", "stream_options"}
CHAT_ONLY = {"messages", "max_completion_tokens", "tools", "tool_choice", "functions", "function_call"}
COMPLETION_ONLY = {"prompt"}
ROLES = ("system", "developer", "user", "assistant", "tool")


@dataclass(frozen=True)
class Job:
    """One request, checked: what the inferlet gets (:meth:`inferlet_request`) and how to answer."""

    chat: bool
    model: str
    max_tokens: int
    temperature: float
    top_p: float
    seed: int | None
    stop: tuple[str, ...]
    n: int
    stream: bool
    include_usage: bool
    messages: tuple[dict, ...] = ()
    prompt: str = ""
    tools: tuple[dict, ...] = ()  # checked by tools.check_tools; the messages are then AsyncLM's
    prefix: tuple[str, ...] = ()  # with tools: the open assistant turn so far, segment by segment
    results: tuple[str, ...] = ()  # with tools: the turn's further results, given one per wait

    def inferlet_request(self) -> str:
        """The chat-completion inferlet's one argument."""
        body = {"max_tokens": self.max_tokens, "temperature": self.temperature, "top_p": self.top_p,
                "seed": self.seed, "stop": list(self.stop), "n": self.n, "stream": self.stream}
        body.update({"messages": list(self.messages)} if self.chat else {"prompt": self.prompt})
        if self.tools:
            # Not streamed from the inferlet: text or calls is known only at the end (app.Reply).
            body.update(adapter=cml_tools.ADAPTER, prefix=list(self.prefix), results=list(self.results),
                        wait=cml_tools.trap_text(), stream=False)
        return json.dumps(body)


def parse_body(raw: bytes) -> dict:
    try:
        body = json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        raise bad_request("We could not parse the JSON body of your request. The body must be a JSON object.") \
            from None
    if not isinstance(body, dict):
        raise bad_request("The body of your request must be a JSON object.")
    return body


def parse_job(body: dict, chat: bool, max_context: int = 0) -> Job:
    """Check a request body; raises :class:`ApiError` (400) naming the first bad parameter.

    ``max_context``: the model's context length (0: unknown); a ``max_tokens`` that leaves no room for
    a prompt is refused here, before any instance is launched (:func:`check_context` once the prompt's
    tokens are known)."""
    known = COMMON | IGNORED | set(NEUTRAL) | (CHAT_ONLY if chat else COMPLETION_ONLY)
    for name in body:
        if name not in known:
            raise bad_request(f"Unrecognized request argument supplied: {name}", name)
    for name, neutral in NEUTRAL.items():
        if body.get(name, neutral) not in (neutral, None):
            raise bad_request(f"'{name}' is not supported by this server (only {json.dumps(neutral)})", name,
                              "unsupported_parameter")
    if chat:
        for name in ("functions", "function_call"):
            if body.get(name):
                raise bad_request(f"'{name}' is deprecated by OpenAI and not supported here: use 'tools'", name,
                                  "unsupported_parameter")
        if body.get("tool_choice") not in (None, "auto"):
            raise bad_request("only tool_choice 'auto' is supported (the model decides whether to call)",
                              "tool_choice", "unsupported_parameter")
    model = _get(body, "model", str, required=True)
    max_tokens = _get(body, "max_completion_tokens" if chat and "max_completion_tokens" in body else "max_tokens",
                      int, default=CHAT_MAX_TOKENS if chat else COMPLETION_MAX_TOKENS)
    if max_tokens < 1:
        raise bad_request(f"max_tokens must be at least 1, not {max_tokens}", "max_tokens")
    if max_context and max_tokens >= max_context:  # a prompt has a token at least
        raise bad_request(f"This model's maximum context length is {max_context} tokens. However, you requested "
                          f"{max_tokens} tokens for the completion alone. Please reduce max_tokens.", "max_tokens",
                          "context_length_exceeded")
    temperature = float(_get(body, "temperature", (int, float), default=1.0))
    if not 0 <= temperature <= 2:
        raise bad_request(f"{temperature} is not in [0, 2] - 'temperature'", "temperature")
    top_p = float(_get(body, "top_p", (int, float), default=1.0))
    if not 0 < top_p <= 1:
        raise bad_request(f"{top_p} is not in (0, 1] - 'top_p'", "top_p")
    n = _get(body, "n", int, default=1)
    if not 1 <= n <= MAX_N:
        raise bad_request(f"n must be from 1 to {MAX_N}, not {n}", "n")
    stream = _get(body, "stream", bool, default=False)
    options = _get(body, "stream_options", dict, default={})
    if options and not stream:
        raise bad_request("stream_options may only be set when stream is true", "stream_options")
    job = dict(chat=chat, model=model, max_tokens=max_tokens, temperature=temperature, top_p=top_p,
               seed=_get(body, "seed", int, default=None), stop=_stops(body.get("stop")), n=n, stream=stream,
               include_usage=bool(options.get("include_usage")))
    if chat and body.get("tools") is not None:
        tools = cml_tools.check_tools(body["tools"])
        messages, prefix, results = _tool_messages(body.get("messages"), tools)
        return Job(**job, messages=messages, tools=tools, prefix=prefix, results=results)
    if chat:
        return Job(**job, messages=_messages(body.get("messages")))
    return Job(**job, prompt=_prompt(body.get("prompt")))


def check_context(job: Job, prompt_tokens: int, max_context: int) -> None:
    """400 unless the prompt and the completion fit the model's context together, as OpenAI words it."""
    if prompt_tokens + job.max_tokens > max_context:
        where = "messages" if job.chat else "prompt"
        raise bad_request(f"This model's maximum context length is {max_context} tokens. However, you requested "
                          f"{prompt_tokens + job.max_tokens} tokens ({prompt_tokens} in the {where}, "
                          f"{job.max_tokens} in the completion). Please reduce the length of the {where} or "
                          "completion.", where, "context_length_exceeded")


def _get(body: dict, name: str, kind, default=None, required: bool = False):
    value = body.get(name)
    if value is None:
        if required:
            raise bad_request(f"Missing required parameter: '{name}'.", name, "missing_required_parameter")
        return default
    kinds = kind if isinstance(kind, tuple) else (kind,)
    if isinstance(value, bool) and bool not in kinds or not isinstance(value, kinds):
        expected = " or ".join(k.__name__ for k in kinds).replace("int or float", "number")
        raise bad_request(f"Invalid type for '{name}': expected {expected}, got {type(value).__name__} "
                          f"({json.dumps(value)[:40]})", name, "invalid_type")
    return value


def _stops(value) -> tuple[str, ...]:
    stops = [value] if isinstance(value, str) else value if value is not None else []
    if not isinstance(stops, list) or not all(isinstance(s, str) and s for s in stops):
        raise bad_request("'stop' must be a non-empty string or a list of them", "stop", "invalid_type")
    if len(stops) > MAX_STOPS:
        raise bad_request(f"'stop' holds at most {MAX_STOPS} strings", "stop")
    return tuple(stops)


def _checked_messages(value) -> list[tuple[str, dict, str]]:
    """``(where, message, role)`` for each message (``developer`` is ``system``)."""
    if not isinstance(value, list) or not value:
        raise bad_request("'messages' must be a non-empty list of messages", "messages",
                          "missing_required_parameter" if value is None else "invalid_type")
    checked = []
    for i, message in enumerate(value):
        where = f"messages[{i}]"
        if not isinstance(message, dict) or message.get("role") not in ROLES:
            raise bad_request(f"{where}: a message is an object whose 'role' is one of {', '.join(ROLES)}",
                              f"{where}.role")
        checked.append((where, message, "system" if message["role"] == "developer" else message["role"]))
    return checked


def _messages(value) -> tuple[dict, ...]:
    messages = []
    for where, message, role in _checked_messages(value):
        if role == "tool" or message.get("tool_calls"):
            raise bad_request(f"{where}: tool calls and results need the request's 'tools'",
                              f"{where}.role" if role == "tool" else f"{where}.tool_calls")
        messages.append({"role": role, "content": _content(message.get("content"), where)})
    return tuple(messages)


def _tool_messages(value, tools: tuple[dict, ...]) -> tuple[tuple[dict, ...], tuple[str, ...], tuple[str, ...]]:
    """The conversation for AsyncLM's CML (see :mod:`.tools`): chat messages under its system prompt;
    the open assistant turn the model goes on writing, as the segments the inferlet fills one by one
    (what the model wrote, then its first result, each alone as in training); and the turn's further
    results, which the inferlet gives the model one per wait."""
    extra, messages, turn, owed = [], [], None, set()
    for where, message, role in _checked_messages(value):
        if role == "tool":
            call_id = message.get("tool_call_id")
            if turn is None or call_id not in owed:
                raise bad_request(f"{where}.tool_call_id {call_id!r} answers no tool call of the assistant "
                                  "message before it", f"{where}.tool_call_id")
            owed.discard(call_id)
            turn.append((cml_tools.result_turn(call_id, _content(message.get("content"), where)), False))
            continue
        content = "" if role == "assistant" and message.get("content") is None \
            else _content(message.get("content"), where)
        if role == "assistant":
            calls = message.get("tool_calls") or []
            if not isinstance(calls, list):
                raise bad_request(f"{where}.tool_calls must be a list", f"{where}.tool_calls", "invalid_type")
            turn = [] if turn is None else turn
            if calls:  # the turn goes on: the calls' results follow
                pairs = [cml_tools.call_text(call, f"{where}.tool_calls[{j}]") for j, call in enumerate(calls)]
                turn.append(((content + "\n" if content else "") + cml_tools.calls_turn(pairs), True))
                owed |= {call_id for call_id, _ in pairs}
                continue
            turn.append((content, True))
        if turn is not None:  # the assistant's turn ends here (with its answer, or before a new message)
            messages.append({"role": "assistant", "content": "".join(_with_waits(turn))})
            turn, owed = None, set()
        if role == "system" and not messages:
            extra.append(content)  # before the conversation: after AsyncLM's rules and functions
        elif role != "assistant":
            messages.append({"role": role, "content": content})
    system = {"role": "system", "content": cml_tools.system_prompt(tools, "\n\n".join(extra))}
    turn = turn or []
    written = max((i for i, (_, by_model) in enumerate(turn) if by_model), default=-1)
    prefix, results = turn[:written + 1], [text for text, _ in turn[written + 1:]]
    return (system, *messages), tuple(_with_waits(prefix)) + tuple(results[:1]), tuple(results[1:])


def _with_waits(segments: list[tuple[str, bool]]) -> list[str]:
    """Texts of a turn whose results come one per wait, as the model learnt them: a result right after
    another gets the ``[TRAP][END]`` the model would have written between them."""
    texts = []
    for i, (text, by_model) in enumerate(segments):
        if not by_model and i > 0 and not segments[i - 1][1]:
            texts.append(cml_tools.trap_text())
        texts.append(text)
    return texts


def _content(content, where: str) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list) and all(isinstance(p, dict) for p in content):
        for part in content:
            if part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise bad_request(f"{where}.content: only text parts are supported (not {part.get('type')!r})",
                                  f"{where}.content")
        return "".join(part["text"] for part in content)
    raise bad_request(f"{where}.content must be a string or a list of text parts", f"{where}.content",
                      "invalid_type")


def _prompt(value) -> str:
    if isinstance(value, list) and len(value) == 1 and isinstance(value[0], str):
        return value[0]
    if isinstance(value, str) and value:
        return value
    if value == "":
        raise bad_request("'prompt' must not be empty", "prompt")
    if value is None:
        raise bad_request("Missing required parameter: 'prompt'.", "prompt", "missing_required_parameter")
    raise bad_request("'prompt' must be a string (lists of prompts and token ids are not supported)", "prompt",
                      "invalid_type")

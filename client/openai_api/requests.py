"""Checking the JSON body of a Chat Completions or Completions request into a :class:`Job`.

What the chat-completion inferlet can do is accepted; a parameter it cannot honour fails with a
400 naming it, never silently ignored (``logprobs``, penalties, ``tools``, ...). Parameters that
change nothing here (``user``, ``metadata``, ``store``, ...) are accepted and ignored.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

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
ROLES = ("system", "developer", "user", "assistant")


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

    def inferlet_request(self) -> str:
        """The chat-completion inferlet's one argument."""
        body = {"max_tokens": self.max_tokens, "temperature": self.temperature, "top_p": self.top_p,
                "seed": self.seed, "stop": list(self.stop), "n": self.n, "stream": self.stream}
        body.update({"messages": list(self.messages)} if self.chat else {"prompt": self.prompt})
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


def parse_job(body: dict, chat: bool) -> Job:
    """Check a request body; raises :class:`ApiError` (400) naming the first bad parameter."""
    known = COMMON | IGNORED | set(NEUTRAL) | (CHAT_ONLY if chat else COMPLETION_ONLY)
    for name in body:
        if name not in known:
            raise bad_request(f"Unrecognized request argument supplied: {name}", name)
    for name, neutral in NEUTRAL.items():
        if body.get(name, neutral) not in (neutral, None):
            raise bad_request(f"'{name}' is not supported by this server (only {json.dumps(neutral)})", name,
                              "unsupported_parameter")
    if chat:
        for name in ("tools", "functions"):
            if body.get(name):
                raise bad_request("tools are not supported by this model yet", name, "unsupported_parameter")
    model = _get(body, "model", str, required=True)
    max_tokens = _get(body, "max_completion_tokens" if chat and "max_completion_tokens" in body else "max_tokens",
                      int, default=CHAT_MAX_TOKENS if chat else COMPLETION_MAX_TOKENS)
    if max_tokens < 1:
        raise bad_request(f"max_tokens must be at least 1, not {max_tokens}", "max_tokens")
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
    if chat:
        return Job(**job, messages=_messages(body.get("messages")))
    return Job(**job, prompt=_prompt(body.get("prompt")))


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


def _messages(value) -> tuple[dict, ...]:
    if not isinstance(value, list) or not value:
        raise bad_request("'messages' must be a non-empty list of messages", "messages",
                          "missing_required_parameter" if value is None else "invalid_type")
    messages = []
    for i, message in enumerate(value):
        where = f"messages[{i}]"
        if not isinstance(message, dict) or message.get("role") not in ROLES:
            raise bad_request(f"{where}: a message is an object whose 'role' is one of {', '.join(ROLES)}"
                              + (" (tool messages need tools, which are not supported yet)"
                                 if isinstance(message, dict) and message.get("role") == "tool" else ""),
                              f"{where}.role")
        if message.get("tool_calls"):
            raise bad_request("tools are not supported by this model yet", f"{where}.tool_calls",
                              "unsupported_parameter")
        role = "system" if message["role"] == "developer" else message["role"]
        messages.append({"role": role, "content": _content(message.get("content"), where)})
    return tuple(messages)


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

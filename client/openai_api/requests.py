"""Checking the JSON body of a Chat Completions or Completions request into a :class:`Job`.

What the chat-completion inferlet can do is accepted; a parameter it cannot honour fails with a
400 naming it, never silently ignored (``echo``, ``best_of``, ``suffix``, ``functions``, ...).
Parameters that change nothing here (``user``, ``metadata``, ``store``, ...) are accepted and
ignored. ``response_format``, ``logit_bias``, the penalties and vLLM's ``top_k``, ``min_p`` and
``repetition_penalty`` become the inferlet's shaped sampling (``inferlet.Shape``: a grammar, biases,
penalties, log-probabilities); ``tools`` run on AsyncLM's CML (:mod:`.tools`), ``tool_choice``
held by a grammar over it.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass

from . import tools as cml_tools
from .errors import bad_request

_SCHEMA_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")

CHAT_MAX_TOKENS = 512  # OpenAI's chat default is "until the model stops"; oven's, this many
COMPLETION_MAX_TOKENS = 16  # OpenAI's documented default for /v1/completions
MAX_N = 16
MAX_PROMPTS = 16  # a completions request's list of prompts
MAX_STOPS = 4
MAX_TOP_LOGPROBS = 20  # chat's top_logprobs, as OpenAI
MAX_COMPLETION_LOGPROBS = 5  # the completions' logprobs, as OpenAI
MAX_LOGIT_BIASES = 1024
IGNORED = {"user", "metadata", "store", "service_tier", "modalities", "prediction",
           "reasoning_effort", "verbosity", "prompt_cache_key", "safety_identifier"}
# Accepted only at the value that means "off".
NEUTRAL = {"echo": False, "best_of": 1, "suffix": None}
COMMON = {"model", "max_tokens", "temperature", "top_p", "seed", "stop", "n", "stream", "stream_options",
          "logprobs", "logit_bias", "presence_penalty", "frequency_penalty", "response_format",
          "top_k", "min_p", "repetition_penalty"}  # the last three: vLLM's extra parameters
CHAT_ONLY = {"messages", "max_completion_tokens", "tools", "tool_choice", "parallel_tool_calls", "functions",
             "function_call", "top_logprobs"}
COMPLETION_ONLY = {"prompt"}
ROLES = ("system", "developer", "user", "assistant", "tool")


@dataclass(frozen=True)
class Sampling:
    """How each token is drawn and shaped: the inferlet's sampler and ``inferlet.Shape``."""

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0: off
    min_p: float = 0.0  # 0: off
    seed: int | None = None
    logit_bias: tuple[tuple[int, float], ...] = ()
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    logprobs: int = -1  # -1: none; N >= 0: each token's log-probability and its N most probable
    grammar: tuple[str, str] | None = None  # (kind, spec) of inferlet.Grammar
    grammar_param: str | None = None  # the parameter a grammar that does not compile is blamed on
    grammar_stretches: str = "all"  # "last": only once the turn's tool results are all given
    one_call: bool = False  # with tools: the reply ends after the model's first call (parallel_tool_calls false)

    def inferlet_fields(self) -> dict:
        return {"temperature": self.temperature, "top_p": self.top_p, "top_k": self.top_k, "min_p": self.min_p,
                "seed": self.seed, "logit_bias": {str(t): v for t, v in self.logit_bias},
                "presence_penalty": self.presence_penalty, "frequency_penalty": self.frequency_penalty,
                "repetition_penalty": self.repetition_penalty, "logprobs": self.logprobs,
                "grammar": list(self.grammar) if self.grammar else None, "grammar_param": self.grammar_param,
                "grammar_stretches": self.grammar_stretches, "one_call": self.one_call}


@dataclass(frozen=True)
class Job:
    """One request, checked: what the inferlet gets (:meth:`inferlet_request`) and how to answer."""

    chat: bool
    model: str
    max_tokens: int
    sampling: Sampling
    stop: tuple[str, ...]
    n: int
    stream: bool
    include_usage: bool
    messages: tuple[dict, ...] = ()
    prompts: tuple[str, ...] = ()  # completions: each gets n choices, prompt k's numbered from k * n
    tools: tuple[dict, ...] = ()  # checked by tools.check_tools; the messages are then AsyncLM's
    prefix: tuple[str, ...] = ()  # with tools: the open assistant turn so far, segment by segment
    results: tuple[str, ...] = ()  # with tools: the turn's further results, given one per wait

    @property
    def num_choices(self) -> int:
        return self.n * max(len(self.prompts), 1)

    @property
    def logprobs(self) -> int:
        """-1: the reply has no log-probabilities; else how many of the most probable each token lists."""
        return self.sampling.logprobs

    def inferlet_request(self, limits: dict | None = None) -> str:
        """The chat-completion inferlet's one argument; ``limits``: where it stops by itself
        (:meth:`.limits.Limits.inferlet_fields`; none: it forwards whatever it is given)."""
        body = {"max_tokens": self.max_tokens, **self.sampling.inferlet_fields(), "stop": list(self.stop),
                "n": self.n, "stream": self.stream, **(limits or {})}
        body.update({"messages": list(self.messages)} if self.chat else
                    {"prompt": self.prompts[0] if len(self.prompts) == 1 else list(self.prompts)})
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


def parse_job(body: dict, chat: bool) -> Job:
    """Check a request body; raises :class:`ApiError` (400) naming the first bad parameter (the server's
    limits are :mod:`.limits`')."""
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
    model = _get(body, "model", str, required=True)
    max_tokens = _get(body, "max_completion_tokens" if chat and "max_completion_tokens" in body else "max_tokens",
                      int, default=CHAT_MAX_TOKENS if chat else COMPLETION_MAX_TOKENS)
    if max_tokens < 1:
        raise bad_request(f"max_tokens must be at least 1, not {max_tokens}", "max_tokens")
    n = _get(body, "n", int, default=1)
    if not 1 <= n <= MAX_N:
        raise bad_request(f"n must be from 1 to {MAX_N}, not {n}", "n")
    stream = _get(body, "stream", bool, default=False)
    options = _get(body, "stream_options", dict, default={})
    if options and not stream:
        raise bad_request("stream_options may only be set when stream is true", "stream_options")
    tools = cml_tools.check_tools(body["tools"]) if chat and body.get("tools") is not None else ()
    sampling = _sampling(body, chat, tools)
    job = dict(chat=chat, model=model, max_tokens=max_tokens, sampling=sampling, stop=_stops(body.get("stop")), n=n,
               stream=stream, include_usage=bool(options.get("include_usage")))
    if tools:
        messages, prefix, results = _tool_messages(body.get("messages"), tools)
        return Job(**job, messages=messages, tools=tools, prefix=prefix, results=results)
    if chat:
        return Job(**job, messages=_messages(body.get("messages")))
    return Job(**job, prompts=_prompts(body.get("prompt")))


def _sampling(body: dict, chat: bool, tools: tuple[dict, ...]) -> Sampling:
    """The sampler's parameters and the Shape's, checked (ranges as OpenAI's and vLLM's)."""
    temperature = _number(body, "temperature", 1.0, 0, 2)
    top_p = _number(body, "top_p", 1.0, 0, 1, low_open=True)
    top_k = _get(body, "top_k", int, default=0)
    if top_k < -1:
        raise bad_request(f"top_k must be -1 or 0 (off) or at least 1, not {top_k}", "top_k")
    min_p = _number(body, "min_p", 0.0, 0, 1)
    if min_p > 0 and top_p < 1:
        raise bad_request("min_p and top_p cannot be combined here (one of them must be off: min_p 0 or top_p 1)",
                          "min_p", "unsupported_parameter")
    repetition = _number(body, "repetition_penalty", 1.0, 0, None, low_open=True)
    presence = _number(body, "presence_penalty", 0.0, -2, 2)
    frequency = _number(body, "frequency_penalty", 0.0, -2, 2)
    grammar, param, stretches = _response_format(body.get("response_format"), tools)
    parallel = _get(body, "parallel_tool_calls", bool, default=True)
    one_call = False
    if tools:
        tool_grammar = cml_tools.choice_grammar(body.get("tool_choice"), tools, parallel)
        if tool_grammar is not None:
            grammar, param, stretches = tool_grammar
        one_call = not parallel and tool_grammar is None  # auto: the first call ends the reply
    elif chat and body.get("tool_choice") not in (None, "none", "auto"):
        raise bad_request("tool_choice 'required' or a function needs the request's 'tools'", "tool_choice")
    return Sampling(temperature=temperature, top_p=top_p, top_k=max(top_k, 0), min_p=min_p,
                    seed=_get(body, "seed", int, default=None), logit_bias=_logit_bias(body.get("logit_bias")),
                    presence_penalty=presence, frequency_penalty=frequency, repetition_penalty=repetition,
                    logprobs=_logprobs(body, chat, tools), grammar=grammar, grammar_param=param,
                    grammar_stretches=stretches, one_call=one_call)


def _number(body: dict, name: str, default: float, low: float, high: float | None, low_open: bool = False) -> float:
    value = float(_get(body, name, (int, float), default=default))
    if not math.isfinite(value) or (value <= low if low_open else value < low) or high is not None and value > high:
        bounds = f"{'(' if low_open else '['}{low:g}, {'inf)' if high is None else f'{high:g}]'}"
        raise bad_request(f"{value} is not in {bounds} - '{name}'", name)
    return value


def _logit_bias(value) -> tuple[tuple[int, float], ...]:
    """OpenAI's ``logit_bias``: token id (a string of digits) -> a number from -100 to 100, added to the
    token's logit before each draw (-100 all but bans it, 100 all but forces it)."""
    if value is None:
        return ()
    if not isinstance(value, dict):
        raise bad_request("'logit_bias' must be an object mapping token ids to numbers from -100 to 100",
                          "logit_bias", "invalid_type")
    if len(value) > MAX_LOGIT_BIASES:
        raise bad_request(f"'logit_bias' holds at most {MAX_LOGIT_BIASES} tokens", "logit_bias")
    biases = []
    for key, bias in value.items():
        if not (key.isascii() and key.isdigit()):
            raise bad_request(f"logit_bias: {key!r} is not a token id (a whole number)", "logit_bias")
        if isinstance(bias, bool) or not isinstance(bias, (int, float)) or not -100 <= bias <= 100:
            raise bad_request(f"logit_bias: the bias of token {key} must be a number from -100 to 100, not "
                              f"{json.dumps(bias)[:40]}", "logit_bias")
        biases.append((int(key), float(bias)))
    return tuple(biases)


def _logprobs(body: dict, chat: bool, tools: tuple[dict, ...]) -> int:
    """-1, or how many of the most probable tokens each token's entry lists: chat's ``logprobs`` (a
    boolean) with ``top_logprobs`` (0 to 20), the completions' ``logprobs`` (0 to 5, null: none)."""
    if chat:
        wanted = _get(body, "logprobs", bool, default=False)
        top = _get(body, "top_logprobs", int, default=None)
        if top is not None and not 0 <= top <= MAX_TOP_LOGPROBS:
            raise bad_request(f"top_logprobs must be from 0 to {MAX_TOP_LOGPROBS}, not {top}", "top_logprobs")
        if top and not wanted:
            raise bad_request("top_logprobs needs logprobs: true", "top_logprobs")
        count = (top or 0) if wanted else -1
    else:
        count = _get(body, "logprobs", int, default=None)
        if count is not None and not 0 <= count <= MAX_COMPLETION_LOGPROBS:
            raise bad_request(f"logprobs must be from 0 to {MAX_COMPLETION_LOGPROBS}, not {count}", "logprobs")
        count = -1 if count is None else count
    if count >= 0 and tools:
        raise bad_request("logprobs are not given with tools here (the model's text becomes tool calls)",
                          "logprobs", "unsupported_parameter")
    return count


def _response_format(value, tools: tuple[dict, ...]) -> tuple[tuple[str, str] | None, str | None, str]:
    """OpenAI's ``response_format`` as a grammar: ``text`` none, ``json_object`` any JSON object,
    ``json_schema`` its ``schema`` (checked by the inferlet's grammar: a 400 with its reason)."""
    if value is None:
        return None, None, "all"
    kind = value.get("type") if isinstance(value, dict) else None
    if kind not in ("text", "json_object", "json_schema"):
        raise bad_request("'response_format' must be {\"type\": \"text\"}, {\"type\": \"json_object\"} or "
                          "{\"type\": \"json_schema\", \"json_schema\": {...}}", "response_format", "invalid_type")
    if kind == "text":
        return None, None, "all"
    if tools:
        raise bad_request("a JSON response_format is not supported together with tools here", "response_format",
                          "unsupported_parameter")
    if kind == "json_object":
        return ("json-schema", json.dumps({"type": "object"})), "response_format", "all"
    spec = value.get("json_schema")
    where = "response_format.json_schema"
    if not isinstance(spec, dict):
        raise bad_request(f"'{where}' must be an object with 'name' and 'schema'", where, "invalid_type")
    name = spec.get("name")
    if not isinstance(name, str) or not _SCHEMA_NAME.fullmatch(name):
        raise bad_request(f"'{where}.name' must be 1 to 64 letters, digits, underscores or dashes", f"{where}.name")
    for field, kinds in (("strict", (bool,)), ("description", (str,))):
        if spec.get(field) is not None and not isinstance(spec[field], kinds):
            raise bad_request(f"'{where}.{field}' must be a {kinds[0].__name__}", f"{where}.{field}", "invalid_type")
    schema = spec.get("schema", {})  # strict or not, the output is held to it
    if not isinstance(schema, (dict, bool)):
        raise bad_request(f"'{where}.schema' must be a JSON Schema object", f"{where}.schema", "invalid_type")
    if schema is False:
        raise bad_request(f"'{where}.schema' is false, which no output satisfies", "response_format")
    # laid out on one line by proto/grammar.py (JSON_LAYOUT) unless the schema's own x-guidance says otherwise
    return ("json-schema", json.dumps({} if schema is True else schema)), "response_format", "all"


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


def _prompts(value) -> tuple[str, ...]:
    """The completions' ``prompt``: a string or a list of strings (token ids are not taken)."""
    if value is None:
        raise bad_request("Missing required parameter: 'prompt'.", "prompt", "missing_required_parameter")
    prompts = [value] if isinstance(value, str) else value
    if not isinstance(prompts, list) or not prompts or not all(isinstance(p, str) for p in prompts):
        raise bad_request("'prompt' must be a string or a non-empty list of strings (token ids are not supported)",
                          "prompt", "invalid_type")
    if len(prompts) > MAX_PROMPTS:
        raise bad_request(f"'prompt' holds at most {MAX_PROMPTS} prompts here, not {len(prompts)}", "prompt")
    if not all(prompts):
        raise bad_request("'prompt' must not be empty" if len(prompts) == 1 else
                          f"prompt[{prompts.index('')}] must not be empty", "prompt")
    return tuple(prompts)

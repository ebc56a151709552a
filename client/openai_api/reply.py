"""The answer to one completion, built from the chat-completion inferlet's messages: whole, or as
server-sent events (OpenAI's chunks, then the usage if asked, then ``[DONE]``)."""

from __future__ import annotations

import json
import secrets
import time

from .errors import SERVER, ApiError
from .limits import request_size_failure
from .requests import Job
from .session import InferletFailed
from .tools import parse_reply


class Reply:
    """The answer to one completion, built from the inferlet's messages (see inferlets/chat-completion)."""

    def __init__(self, job: Job, id_prefix: str, prompt_tokens: int):
        self.job, self.prompt_tokens = job, prompt_tokens
        self.id, self.created = id_prefix + secrets.token_hex(12), int(time.time())
        self.texts = [""] * job.num_choices
        self.finish: list[str | None] = [None] * job.num_choices
        self.entries: list[list[list]] = [[] for _ in range(job.num_choices)]  # [token, logprob, top] per token
        self.offsets = [0] * job.num_choices  # the completions' text_offset of each choice's next token
        self.completion_tokens = 0

    def add(self, message: dict) -> None:
        i = message["index"]
        self.texts[i] += message["text"]
        self.entries[i] += message.get("logprobs", [])
        if "finish_reason" in message:
            self.finish[i] = message["finish_reason"]
            self.completion_tokens += message["completion_tokens"]

    def usage(self) -> dict:
        return {"prompt_tokens": self.prompt_tokens, "completion_tokens": self.completion_tokens,
                "total_tokens": self.prompt_tokens + self.completion_tokens}

    def answer(self, i: int) -> tuple[str, list[dict], str | None]:
        """Choice ``i``'s content, tool calls (with tools: the CML calls the model wrote) and finish reason."""
        if not self.job.tools:
            return self.texts[i], [], self.finish[i]
        content, calls = parse_reply(self.texts[i], self.job.tools)
        return content, calls, "tool_calls" if calls else self.finish[i]

    def logprobs(self, i: int, entries: list[list]) -> dict | None:
        """``entries`` of choice ``i`` as OpenAI shapes them: chat's ``{"content": [{"token", "logprob",
        "bytes", "top_logprobs"}]}``, the completions' ``{"tokens", "token_logprobs", "top_logprobs",
        "text_offset"}`` (offsets from the completion's start, each token's text its own decoding);
        None without ``logprobs``. A token's ``bytes`` are its text's UTF-8 (a token that ends inside a
        character decodes to U+FFFD, as in vLLM)."""
        if self.job.logprobs < 0:
            return None
        if self.job.chat:
            return {"content": [{**_token(token, logprob),
                                 "top_logprobs": [_token(t, lp) for t, lp in top]} for token, logprob, top in entries],
                    "refusal": None}
        offsets = []
        for token, _, _ in entries:
            offsets.append(self.offsets[i])
            self.offsets[i] += len(token)
        return {"tokens": [token for token, _, _ in entries], "token_logprobs": [lp for _, lp, _ in entries],
                "top_logprobs": [dict(top) for _, _, top in entries], "text_offset": offsets}

    def whole(self) -> dict:
        if self.job.chat:
            choices = []
            for i in range(self.job.num_choices):
                content, calls, finish = self.answer(i)
                message = {"role": "assistant", "content": content or (None if calls else ""), "refusal": None}
                choices.append({"index": i, "message": message | ({"tool_calls": calls} if calls else {}),
                                "logprobs": self.logprobs(i, self.entries[i]), "finish_reason": finish})
        else:
            choices = [{"index": i, "text": text, "logprobs": self.logprobs(i, self.entries[i]),
                        "finish_reason": self.finish[i]} for i, text in enumerate(self.texts)]
        return {**self._head("chat.completion" if self.job.chat else "text_completion"), "choices": choices,
                "usage": self.usage()}

    async def events(self, messages):
        """Server-sent events: a chunk per message, the usage if asked, then ``[DONE]``."""
        try:
            if self.job.chat:
                for i in range(self.job.num_choices):
                    yield _sse(self._chunk(i, {"role": "assistant", "content": ""}, None))
            async for message in messages:
                self.add(message)
                i, finish = message["index"], message.get("finish_reason")
                if self.job.tools:  # text or calls? known when the choice ends: sent whole then
                    if finish:
                        for chunk in self._tool_chunks(i):
                            yield _sse(chunk)
                    continue
                if message["text"] or message.get("logprobs"):
                    logprobs = self.logprobs(i, message.get("logprobs", []))
                    yield _sse(self._chunk(i, self._delta(message["text"]), None, logprobs))
                if finish:
                    yield _sse(self._chunk(i, {} if self.job.chat else self._delta(""), finish))
            if self.job.include_usage:
                yield _sse({**self._head(self._chunk_object()), "choices": [], "usage": self.usage()})
        except (InferletFailed, ApiError) as exc:
            yield _sse((exc if isinstance(exc, ApiError) else failure(exc)).body())
        yield "data: [DONE]\n\n"

    def _tool_chunks(self, i: int) -> list[dict]:
        content, calls, finish = self.answer(i)
        chunks = [self._chunk(i, {"content": content}, None)] if content else []
        if calls:
            chunks.append(self._chunk(i, {"tool_calls": [{"index": k, **call} for k, call in enumerate(calls)]}, None))
        return [*chunks, self._chunk(i, {}, finish)]

    def _delta(self, text: str) -> dict:
        return {"content": text} if self.job.chat else {"text": text}

    def _chunk(self, index: int, delta: dict, finish: str | None, logprobs: dict | None = None) -> dict:
        choice = {"index": index, "logprobs": logprobs, "finish_reason": finish}
        choice.update({"delta": delta} if self.job.chat else delta)
        return {**self._head(self._chunk_object()), "choices": [choice]}

    def _chunk_object(self) -> str:
        return "chat.completion.chunk" if self.job.chat else "text_completion"

    def _head(self, obj: str) -> dict:
        return {"id": self.id, "object": obj, "created": self.created, "model": self.job.model}


def failure(exc: InferletFailed) -> ApiError:
    """A failed run: a 400 if the request's own size caused it, else the server's fault (500)."""
    return request_size_failure(str(exc)) or ApiError(500, str(exc), SERVER)


def _token(token: str, logprob: float) -> dict:
    return {"token": token, "logprob": logprob, "bytes": list(token.encode("utf-8", "replace"))}


def _sse(data: dict) -> str:
    return f"data: {json.dumps(data)}\n\n"


"""What one request may ask of the server, checked before any forward: 400 ``context_length_exceeded``.

A request's size is the user's to change, so a request past a limit is a 400 naming the limit and
the request's figures (as OpenAI and vLLM word it), never a 500 after minutes of work that the
``openai`` client would retry. The limits come from the server's info: the model's positions, the
KvPages one instance may hold (its quota, within the pool) and the longest forward where the server
forwards a prompt in one (``--prefill-chunk-tokens 0``; else it reports none). ``max_tokens`` alone
is checked before the launch; the prompts' sizes are known once the chat-completion inferlet has
tokenized them, before it forwards anything: it sends them, and stops there itself past
``max_context`` or ``max_prompt_tokens`` (:meth:`Limits.inferlet_fields`).
"""

from __future__ import annotations

from dataclasses import dataclass

from oven.proto.control import ServerInfoReply

from .errors import ApiError, bad_request

CONTEXT_LENGTH_EXCEEDED = "context_length_exceeded"
# How the server fails a forward too large for it (the inference process's codes, the control's quota):
# what a request's own size causes, if the checks here missed it (say, tool results past the context).
REQUEST_SIZE_FAILURES = ("bad_position:", "batch_too_large:", "kvpage quota exceeded")


@dataclass(frozen=True)
class Limits:
    max_position: int  # the model's positions: a prompt and its completion together
    page_size: int = 16
    max_kv_pages: int = 0  # KvPages one instance may hold; 0: unknown
    max_prompt_tokens: int = 0  # one forward's input tokens; 0: unknown

    @classmethod
    def of(cls, info: ServerInfoReply) -> Limits:
        return cls(info.max_context, info.page_size, info.max_kv_pages_per_instance, info.max_batch_tokens)

    @property
    def max_context(self) -> int:
        """The served context length: the model's positions, or the tokens one instance's KvPages hold."""
        held = self.max_kv_pages * self.page_size
        return min(self.max_position, held) if held else self.max_position

    def inferlet_fields(self) -> dict:
        """Where chat-completion stops by itself once it knows the prompts' sizes (see its app.py)."""
        fields = {"max_context": self.max_context}
        return fields | ({"max_prompt_tokens": self.max_prompt_tokens} if self.max_prompt_tokens else {})

    def check_max_tokens(self, max_tokens: int) -> None:
        """Before any launch: a completion that leaves no room for a prompt's one token."""
        if self.max_context and max_tokens >= self.max_context:
            raise bad_request(f"This model's maximum context length is {self.max_context} tokens. However, you "
                              f"requested {max_tokens} tokens for the completion alone. Please reduce max_tokens.",
                              "max_tokens", CONTEXT_LENGTH_EXCEEDED)

    def check(self, prompt_sizes: list[int], max_tokens: int, n: int, chat: bool) -> None:
        """400 unless every prompt (of ``prompt_sizes`` tokens) fits with its completion, each is forwarded
        in one go, and the ``n`` choices of every prompt fit in one instance's KvPages together."""
        where = "messages" if chat else "prompt"
        for k, size in enumerate(prompt_sizes):
            which = where if len(prompt_sizes) == 1 else f"prompt[{k}]"
            if size + max_tokens > self.max_context:
                raise bad_request(f"This model's maximum context length is {self.max_context} tokens. However, "
                                  f"you requested {size + max_tokens} tokens ({size} in the {which}, {max_tokens} "
                                  f"in the completion). Please reduce the length of the {which} or completion.",
                                  where, CONTEXT_LENGTH_EXCEEDED)
            if self.max_prompt_tokens and size > self.max_prompt_tokens:
                raise bad_request(f"This server forwards at most {self.max_prompt_tokens} tokens at once. However, "
                                  f"the {which} holds {size} tokens. Please reduce its length.", where,
                                  CONTEXT_LENGTH_EXCEEDED)
        pages = sum(self._pages(size, max_tokens, n) for size in prompt_sizes)
        if self.max_kv_pages and pages > self.max_kv_pages:
            held = self.max_kv_pages * self.page_size
            raise bad_request(f"This server holds at most {held} tokens of KV cache for one request "
                              f"({self.max_kv_pages} pages of {self.page_size}). However, {len(prompt_sizes)} "
                              f"prompt(s) of {sum(prompt_sizes)} tokens with {n} choice(s) of {max_tokens} tokens "
                              f"each need up to {pages} pages. Please reduce n, max_tokens or the {where}.",
                              "n" if n > 1 else where, CONTEXT_LENGTH_EXCEEDED)

    def _pages(self, prompt: int, completion: int, n: int) -> int:
        """The most KvPages one prompt's choices hold: one choice decodes on the prompt's context; ``n``
        fork it, each holding its completion's pages and a copy of the prompt's last (shared) page."""
        ps = self.page_size
        if n == 1:
            return -(-(prompt + completion) // ps)
        return -(-prompt // ps) + n * (-(-completion // ps) + 1)


def request_size_failure(message: str) -> ApiError | None:
    """The 400 for an inferlet failure that a request's own size caused, or None for any other failure."""
    if any(marker in message for marker in REQUEST_SIZE_FAILURES):
        return bad_request(f"This request is larger than this server takes: {message}", None, CONTEXT_LENGTH_EXCEEDED)
    return None

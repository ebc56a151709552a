"""``tokenize``: answered in the runner from the model's tokenizer spec, on the client's own CPU.

Input is capped: a tokenize of tens of megabytes takes seconds of the runner's thread (and as much
memory again in ids), which the runner's watchdog would otherwise have to end by killing it.
"""

from __future__ import annotations

MAX_TEXT_BYTES = 4 << 20  # one tokenize, render-chat or detokenize result
MAX_TOKENS = 1 << 20  # one detokenize


def _check_text(what: str, num_bytes: int) -> None:
    if num_bytes > MAX_TEXT_BYTES:
        raise ValueError(f"{what}: {num_bytes} bytes of text, past the limit of {MAX_TEXT_BYTES >> 20} MiB")


def tokenize(guest, text: str) -> list[int]:
    _check_text("tokenize", len(text))  # characters: at most as many as bytes, checked before encoding
    return guest.tokenizer.encode(text)


def detokenize(guest, tokens: list[int]) -> str:
    if len(tokens) > MAX_TOKENS:
        raise ValueError(f"detokenize: {len(tokens)} tokens, past the limit of {MAX_TOKENS}")
    return guest.tokenizer.decode(list(tokens))


def render_chat(guest, roles: list[str], contents: list[str], add_generation_prompt: bool) -> str:
    if len(roles) != len(contents):
        raise ValueError(f"render-chat: {len(roles)} roles but {len(contents)} contents")
    _check_text("render-chat", sum(map(len, contents)))
    messages = [{"role": r, "content": c} for r, c in zip(roles, contents)]
    return guest.tokenizer.render_chat(messages, add_generation_prompt)


FUNCS = {
    "tokenize": tokenize,
    "detokenize": detokenize,
    "vocab-size": lambda guest: guest.setup.vocab_size,
    "stop-tokens": lambda guest: sorted(guest.tokenizer.stop_token_ids),
    "render-chat": render_chat,
}

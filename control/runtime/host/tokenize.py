"""``tokenize``: answered in the control process from the model's tokenizer spec."""

from __future__ import annotations


def render_chat(inst, roles: list[str], contents: list[str], add_generation_prompt: bool) -> str:
    if len(roles) != len(contents):
        raise ValueError(f"render-chat: {len(roles)} roles but {len(contents)} contents")
    messages = [{"role": r, "content": c} for r, c in zip(roles, contents)]
    return inst.host.tokenizer.render_chat(messages, add_generation_prompt)


FUNCS = {
    "tokenize": lambda inst, text: inst.host.tokenizer.encode(text),
    "detokenize": lambda inst, tokens: inst.host.tokenizer.decode(list(tokens)),
    "vocab-size": lambda inst: inst.host.info.vocab_size,
    "stop-tokens": lambda inst: sorted(inst.host.tokenizer.stop_token_ids),
    "render-chat": render_chat,
}

"""``grammars`` in a runner: grammars are checked and compiled here, on the client's own CPU and memory,
and reported to the control process with the handle the guest got (control/runtime/host/grammars.py).

A grammar that does not compile, or that is past llguidance's caps (proto/grammar.py), is the guest's
error at ``create-grammar``, never the inference process's; what reaches it has passed here.
"""

from __future__ import annotations

from collections import OrderedDict

from oven.control.runtime.decoders import MAX_DECODERS, MAX_GRAMMARS
from oven.proto import grammar as g

_CHECKED_MAX = 256  # grammars remembered as checked, per runner (a server answering one schema again and again)
_checked: OrderedDict[tuple[str, str], str] = OrderedDict()  # (kind, spec) -> llguidance text
_llg_tokenizer = None


def _tokenizer(guest):
    global _llg_tokenizer
    if _llg_tokenizer is None:  # about 0.3 s, once per runner and only if a grammar comes
        spec = guest.setup.tokenizer
        _llg_tokenizer = g.tokenizer(spec.tokenizer_json, guest.setup.vocab_size, spec.stop_token_ids)
    return _llg_tokenizer


def _compile(guest, kind: str, spec: str) -> str:
    key = (kind, spec)
    if key in _checked:
        _checked.move_to_end(key)
        return _checked[key]
    text = g.grammar_text(kind, spec)
    g.check(text, _tokenizer(guest))
    _checked[key] = text
    if len(_checked) > _CHECKED_MAX:
        _checked.popitem(last=False)
    return text


def create_grammar(guest, kind: str, spec: str):
    """The new grammar's handle, or the error text (result<u32, string>)."""
    if len(guest.grammars) >= MAX_GRAMMARS:
        return f"create-grammar: {MAX_GRAMMARS} grammars are held already (drop-grammar some)"
    try:
        text = _compile(guest, kind, spec)
    except g.GrammarError as exc:
        return f"{kind}: {exc}"
    handle = guest.forward("create-grammar", (text,), guest.num_grammars_made + 1)
    guest.num_grammars_made = handle
    guest.grammars.add(handle)
    return handle


def drop_grammar(guest, grammar: int) -> None:
    if grammar in guest.grammars:
        guest.grammars.discard(grammar)
        guest.forward("drop-grammar", (grammar,), None)


def create_decoder(guest, grammar: int, presence: float, frequency: float, repetition: float):
    """The new decoder's handle, or the error text (result<u32, string>)."""
    if len(guest.decoders) >= MAX_DECODERS:
        return f"create-decoder: {MAX_DECODERS} decoders are held already (drop-decoder some)"
    if grammar and grammar not in guest.grammars:
        return f"create-decoder: grammar {grammar} is not held by this inferlet"
    if (problem := g.penalty_problem(presence, frequency, repetition)) is not None:
        return f"create-decoder: {problem}"
    handle = guest.forward("create-decoder", (grammar, presence, frequency, repetition), guest.num_decoders_made + 1)
    guest.num_decoders_made = handle
    guest.decoders.add(handle)
    return handle


def drop_decoder(guest, decoder: int) -> None:
    if decoder in guest.decoders:
        guest.decoders.discard(decoder)
        guest.forward("drop-decoder", (decoder,), None)


FUNCS = {"create-grammar": create_grammar, "drop-grammar": drop_grammar, "create-decoder": create_decoder,
         "drop-decoder": drop_decoder}

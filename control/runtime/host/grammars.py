"""``grammars``: grammars and decoders, applied as the runner reports them.

The runner answers ``create-grammar`` and ``create-decoder`` itself (it checks and compiles the grammar on
its client's CPU, control/runner/grammars.py) and reports them with the handle it gave the guest and,
for a grammar, llguidance's text of it; here the instance keeps the text and its decoders
(:mod:`..decoders`), whose specs its ``forward-sample-shaped`` items carry to the inference process.
"""

from __future__ import annotations

from oven.proto import inference as p

from ..decoders import MAX_DECODERS, MAX_GRAMMARS


def create_grammar(inst, text: str) -> int:
    if len(inst.grammars) >= MAX_GRAMMARS:
        raise ValueError(f"create-grammar: {MAX_GRAMMARS} grammars are held already")
    inst.num_grammars_made += 1
    inst.grammars[inst.num_grammars_made] = text
    return inst.num_grammars_made


def drop_grammar(inst, grammar: int) -> None:
    inst.grammars.pop(grammar, None)


def create_decoder(inst, grammar: int, presence: float, frequency: float, repetition: float) -> int:
    if len(inst.decoders) >= MAX_DECODERS:
        raise ValueError(f"create-decoder: {MAX_DECODERS} decoders are held already")
    if grammar and grammar not in inst.grammars:
        raise ValueError(f"create-decoder: grammar {grammar} is not held")
    spec = p.DecoderSpec(inst.grammars[grammar] if grammar else "", presence, frequency, repetition)
    inst.num_decoders_made += 1
    inst.decoders[inst.num_decoders_made] = inst.host.calls.decoder_ids.create(spec)
    return inst.num_decoders_made


def drop_decoder(inst, decoder: int) -> None:
    if (dropped := inst.decoders.pop(decoder, None)) is not None:
        inst.host.calls.decoder_ids.drop(dropped)


def drop_all(inst) -> None:
    """The instance ended: its decoders go once the commands naming them settle."""
    for decoder in list(inst.decoders):
        drop_decoder(inst, decoder)


FUNCS = {"create-grammar": create_grammar, "drop-grammar": drop_grammar, "create-decoder": create_decoder,
         "drop-decoder": drop_decoder}

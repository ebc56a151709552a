"""Grammars for constrained decoding: the kinds an inferlet may name, and how one becomes the form
llguidance matches.

An inferlet names a grammar by kind and text (WIT ``create-grammar``). Its runner turns that into
llguidance's grammar text and checks it against the served tokenizer under :data:`LIMITS`, on the
client's own CPU and memory (a hostile grammar costs its client alone); the inference process then
builds one matcher per decoder from the checked text, under the same limits, and masks each step
with it. Both sides share this module, so a grammar is read one way.
"""

from __future__ import annotations

import json

# llguidance is imported inside the functions: a runner that never sees a grammar never loads it.

KINDS = ("json-schema", "regex", "lark", "choice")
MAX_SPEC_BYTES = 1 << 20  # one grammar's text as the inferlet gives it
MAX_CHOICES = 4096
# JSON laid out as Python's json.dumps does (", " and ": ", no other whitespace). llguidance's default allows
# any run of whitespace between tokens, and a small model then writes newlines until its budget ends; a
# schema's own "x-guidance" options still override this.
JSON_LAYOUT = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


class GrammarError(ValueError):
    """A grammar that cannot be used; the message is one line (two for Lark: where, then what)."""


def penalty_problem(presence: float, frequency: float, repetition: float) -> str | None:
    """Why a decoder's penalties cannot be used (OpenAI's ranges for presence and frequency, vLLM's
    for repetition), or None."""
    for name, value in (("presence", presence), ("frequency", frequency)):
        if not -2.0 <= value <= 2.0:
            return f"{name} penalty {value} is outside [-2, 2]"
    if not 0.0 < repetition <= 10.0:
        return f"repetition penalty {repetition} is outside (0, 10]"
    return None


def limits():
    """llguidance's caps on one grammar: its size, the lexer's states and the work of one mask step.

    Its defaults, named here so that both processes use the same ones: a grammar past them is
    refused when it is created, and a step past them fails its item, never stalls the batch long.
    """
    import llguidance
    return llguidance.LLParserLimits(max_grammar_size=500_000, max_lexer_states=250_000,
                                     initial_lexer_fuel=1_000_000, step_lexer_fuel=200_000, step_max_items=50_000)


def tokenizer(tokenizer_json: str, vocab_size: int, stop_token_ids: list[int]):
    """llguidance's view of the served tokenizer: every stop token counts as end of sequence, so a
    finished grammar allows exactly the tokens that end a generation."""
    import llguidance
    return llguidance.LLTokenizer(tokenizer_json, n_vocab=vocab_size, eos_token=sorted(stop_token_ids))


def grammar_text(kind: str, spec: str) -> str:
    """llguidance's grammar text for ``spec`` of ``kind`` (``choice``: a JSON array of strings, one of
    which is generated verbatim); GrammarError for an unknown kind or text that is not of it."""
    from llguidance import LLMatcher
    if len(spec.encode()) > MAX_SPEC_BYTES:
        raise GrammarError(f"{kind} grammar of {len(spec.encode())} bytes, past the limit of "
                           f"{MAX_SPEC_BYTES >> 20} MiB")
    if kind == "json-schema":
        try:
            schema = json.loads(spec)
        except RecursionError:
            raise GrammarError("json-schema is nested too deeply") from None
        except ValueError as exc:
            raise GrammarError(f"json-schema is not JSON: {exc}") from None
        if not isinstance(schema, (dict, bool)):
            raise GrammarError(f"json-schema must be an object or a boolean, not {type(schema).__name__}")
        try:
            return LLMatcher.grammar_from_json_schema(schema, defaults=JSON_LAYOUT)
        except ValueError as exc:
            raise GrammarError(f"json-schema: {exc}") from None
    if kind == "regex":
        return LLMatcher.grammar_from_regex(spec)
    if kind == "lark":
        return LLMatcher.grammar_from_lark(spec)
    if kind == "choice":
        try:
            options = json.loads(spec)
        except (ValueError, RecursionError) as exc:
            raise GrammarError(f"choice is not a JSON array of strings: {exc}") from None
        if not isinstance(options, list) or not options or not all(isinstance(o, str) and o for o in options):
            raise GrammarError("choice must be a non-empty JSON array of non-empty strings")
        if len(options) > MAX_CHOICES:
            raise GrammarError(f"choice of {len(options)} options, past the limit of {MAX_CHOICES}")
        # Lark string literals take JSON's escapes, so json.dumps quotes any option exactly.
        return LLMatcher.grammar_from_lark("start: " + " | ".join(json.dumps(o) for o in dict.fromkeys(options)))
    raise GrammarError(f"unknown grammar kind {kind!r} (one of {', '.join(KINDS)})")


def check(text: str, llg_tokenizer) -> None:
    """GrammarError unless llguidance accepts ``text`` for ``llg_tokenizer`` under :func:`limits`;
    the message keeps llguidance's line and column and drops its source excerpt."""
    from llguidance import LLMatcher
    error = LLMatcher.validate_grammar(text, llg_tokenizer, limits=limits())
    if error:
        raise GrammarError(_first_line(error))


def matcher(text: str, llg_tokenizer):
    """A fresh matcher of a checked grammar (about a millisecond; llguidance builds its lexer lazily)."""
    from llguidance import LLMatcher
    return LLMatcher(llg_tokenizer, text, log_level=0, limits=limits())


def _first_line(error: str) -> str:
    """llguidance's message without the source excerpt it draws under it ("2(11): Expected ...")."""
    lines = [line for line in error.splitlines() if line.strip()]
    kept = [line for line in lines if not line.lstrip().startswith(("|", "^")) and "| " not in line[:8]]
    return " ".join(kept[:2]) if kept else error.strip()

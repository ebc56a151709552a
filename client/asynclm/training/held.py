"""``--constrain`` in process: a call's text held to the tools' schemas as the server holds it.

``oven asynclm --constrain`` hands the inferlet :func:`~..tools.call_grammar.call_grammar` of its
tools, and the server draws each call's text after ``[HEAD]`` greedily under it (llguidance's mask
on the model's distribution). The check does the same here with the same grammar and the same
llguidance reading of it (``oven.proto.grammar``): from a call's ``[HEAD]`` to its ``[END]``, the
token is the likeliest one the grammar allows, looked for among the decoder's ranked tokens and,
where none of them is allowed, among the whole vocabulary.
"""

from __future__ import annotations

from functools import lru_cache

from ..tools import ToolRegistry
from ..tools.call_grammar import call_grammar, registry_schemas


@lru_cache(maxsize=4)
def llg_tokenizer(tokenizer):
    """llguidance's view of ``tokenizer`` (an oven Tokenizer), built once (about 0.3 s)."""
    from oven.proto import grammar
    return grammar.tokenizer(tokenizer.spec.tokenizer_json, tokenizer.vocab_size, sorted(tokenizer.stop_token_ids))


class HeldCalls:
    """The call grammar of one task's tools; :meth:`choose` picks each token of a call's text."""

    def __init__(self, registry: ToolRegistry, tokenizer):
        from oven.proto import grammar
        self.tokenizer = llg_tokenizer(tokenizer)
        self.vocab_size = tokenizer.vocab_size
        self.text = grammar.grammar_text("lark", call_grammar(registry_schemas(registry)))
        grammar.check(self.text, self.tokenizer)
        self.matcher = None  # while a call's text is written

    @property
    def open(self) -> bool:
        return self.matcher is not None

    def choose(self, ranked: list[int], rank_all) -> int:
        """The next token of the call's text (the first in ``ranked`` the grammar allows, else the first
        in ``rank_all()``, every token ranked); the matcher moves past it and closes at ``[END]``."""
        from oven.proto import grammar
        if self.matcher is None:
            self.matcher = grammar.matcher(self.text, self.tokenizer)
        allowed = lambda token: self.matcher.validate_tokens([token]) == 1  # noqa: E731
        token = next((t for t in ranked if allowed(t)), None)
        if token is None:
            token = next(t for t in rank_all() if allowed(t))
        self.matcher.consume_token(token)
        if self.matcher.is_accepting():  # the grammar ends at the call's [END]
            self.matcher = None
        return token

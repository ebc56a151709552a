"""When generation stops: a token budget, the model's end tokens, extra stop tokens, or stop strings."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Stop:
    """Generation ends at the first condition met: ``max_tokens`` new tokens, one of the model's end
    tokens (if ``eos``) or of ``tokens``, or a stop string in the text. A stop token is kept in the
    generated tokens; ``Context.generate``'s text leaves stop tokens out and is cut before the
    earliest stop string. Like the Rust SDK's ``Stop::max_tokens(n).with_tokens(..).with_string(..)``.
    Empty stop strings are ignored.
    """

    max_tokens: int = 256
    eos: bool = True                # stop at the model's end-of-sequence / end-of-turn tokens
    strings: tuple[str, ...] = ()   # stop once the generated text contains one of these
    tokens: tuple[int, ...] = ()    # stop at any of these tokens too

    def __post_init__(self):
        if isinstance(self.strings, str):
            raise TypeError(f"strings is a tuple of strings: strings=({self.strings!r},)")
        if self.max_tokens < 0:
            raise ValueError("max_tokens must be >= 0")
        object.__setattr__(self, "strings", tuple(s for s in self.strings if s))
        object.__setattr__(self, "tokens", tuple(self.tokens))

    def stop_token_ids(self, end_tokens: frozenset[int]) -> frozenset[int]:
        """Every stop token: ``tokens``, and the model's ``end_tokens`` if ``eos``."""
        return frozenset(self.tokens) | end_tokens if self.eos else frozenset(self.tokens)

    def tail_tokens(self) -> int:
        """How many of the newest tokens a stop string that has just appeared lies within (a token is
        at least one character): the longest stop string's length plus one."""
        return max(map(len, self.strings), default=0) + 1

    def find_string(self, text: str) -> int | None:
        """Where in ``text`` the earliest stop string begins, if any."""
        found = [at for at in map(text.find, self.strings) if at >= 0]
        return min(found) if found else None

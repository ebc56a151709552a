"""When generation stops: a token budget, the model's end tokens, or stop strings."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Stop:
    max_tokens: int = 256
    eos: bool = True                # stop at the model's end-of-sequence / end-of-turn tokens
    strings: tuple[str, ...] = ()   # stop once the generated text contains one of these

    def reached(self, generated: list[int], text: str, end_tokens: frozenset[int]) -> bool:
        if len(generated) >= self.max_tokens or (self.eos and generated and generated[-1] in end_tokens):
            return True
        return any(s in text for s in self.strings)

    def cut(self, text: str) -> str:
        """``text`` up to the first stop string."""
        for s in self.strings:
            at = text.find(s)
            if at >= 0:
                text = text[:at]
        return text

"""Unseen-looking entities for training demo tasks, so the model learns to copy a name, not recall one.

A held-out city such as ``Zurich`` is one token after a space in the question (`` Zurich``) and
three inside the call (``Z``, ``ur``, ``ich`` after ``="``): writing the call means spelling the
word out. A model trained on a few hundred names learns those names; one trained on thousands of
rare words, made-up names and random tickers learns to spell whatever the user wrote.

:class:`NameMaker` draws such entities from ``words``, the capitalised and lower-case words of
the tokenizer's vocabulary (:func:`vocabulary_words`), and from random syllables and letters,
never one of the held-out entities.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass

_SYLLABLES = ("ka", "lo", "mar", "ven", "dra", "ti", "zu", "bel", "sha", "or", "qui", "no", "ren", "tas", "vik",
              "el", "gor", "ami", "lun", "pe", "sto", "hal", "ix", "ra", "dun", "mi", "ost", "cha", "ber", "ya",
              "tor", "esk", "wa", "lin", "gra", "fo", "sel", "um", "brin", "kov", "ad", "nis", "ju", "hav", "ep")
_CITY_FORMS = ("{}", "{}", "{}", "{}", "San {}", "New {}", "Port {}", "{} City", "Lake {}", "{} Falls",
               "{} Springs", "Saint {}", "{} Bay", "Fort {}", "{} de {}", "{} {}")
_QUERY_FORMS = ("{} {}", "how to {} {}", "history of {}", "best {} {}", "{} tutorial", "{} {} tips",
                "what is {}", "{} and {}", "cheap {} {}", "{} {} explained", "the {} {}", "{} for beginners")
_LETTERS = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"


@dataclass(frozen=True)
class Words:
    proper: tuple[str, ...]  # capitalised words the vocabulary has no lower-case twin of (names, places)
    common: tuple[str, ...]  # lower-case words


def vocabulary_words(tokenizer) -> Words:
    """Words that are one token after a space in ``tokenizer``'s vocabulary, in id order."""
    texts = [tokenizer.decode([i]) for i in range(tokenizer.vocab_size)]
    vocab = set(texts)
    proper = tuple(t[1:] for t in texts if re.fullmatch(r" [A-Z][a-z]{3,11}", t) and " " + t[1:].lower() not in vocab)
    common = tuple(t[1:] for t in texts if re.fullmatch(r" [a-z]{4,10}", t))
    return Words(proper, common)


class NameMaker:
    """Random cities, tickers and search queries; none is in ``forbidden`` (compared case-blind)."""

    def __init__(self, rng: random.Random, words: Words, forbidden: set[str]):
        self.rng, self.words = rng, words
        self.forbidden = {f.lower() for f in forbidden}

    def _fresh(self, make) -> str:
        while True:
            name = make()
            if name.lower() not in self.forbidden and not any(part in self.forbidden for part in name.lower().split()):
                return name

    def _made_up(self) -> str:
        word = "".join(self.rng.choice(_SYLLABLES) for _ in range(self.rng.choice((2, 2, 3, 3, 4))))
        return word.capitalize()

    def _word(self) -> str:
        return self.rng.choice(self.words.proper) if self.words.proper and self.rng.random() < 0.6 \
            else self._made_up()

    def city(self) -> str:
        return self._fresh(lambda: self._fill(self.rng.choice(_CITY_FORMS), self._word))

    def symbol(self) -> str:
        return self._fresh(lambda: "".join(self.rng.choice(_LETTERS) for _ in range(
            self.rng.choices((1, 2, 3, 4, 5), weights=(1, 3, 6, 6, 2))[0])))

    def query(self) -> str:
        common = self.words.common or ("things",)
        return self._fresh(lambda: self._fill(self.rng.choice(_QUERY_FORMS), lambda: self.rng.choice(common)))

    @staticmethod
    def _fill(form: str, word) -> str:
        return form.format(*(word() for _ in range(form.count("{}"))))

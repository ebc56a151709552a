"""watermark: green-list watermarking of generated text, and its detector (Kirchenbauer et al. 2023,
"A Watermark for Large Language Models", the soft watermark with a one-token context).

At every step the previous token and the secret KEY seed a generator that splits the vocabulary
into a green list (a fraction GAMMA, default 0.25) and a red one; DELTA (default 2.0) is added to
the green tokens' logits before the draw (``shaped_step`` with a sparse bias over the green list,
one step at a time: the next list depends on the token drawn). ``--delta 0`` generates plain text
the same way (the unwatermarked reference). ``--ignore-eos`` bans the end tokens, so exactly
MAX_NEW_TOKENS are drawn. Sampling is the SDK's ``Temperature`` (T 1.0, seed S 0), so a seed gives
the same text every time.

The split: P = the smallest prime >= the vocabulary size, ``a`` in [1, P) and ``b`` in [0, P) drawn
from ``Rng(KEY * 2**32 + previous token)``; token v is green iff (a*v + b) mod P < round(GAMMA * P).
A keyed affine permutation of the vocabulary instead of the paper's ``randperm``: the green list
is GAMMA * P values of the inverse map, about 12,300 entries for SmolLM2 at 0.25 (an arithmetic
progression mod P: about 4 ms of Python in WebAssembly per list on a 2-core CPU, where a shuffle
of the whole vocabulary would cost tens), and membership is one multiplication, so the detector
needs no list at all. Lists are cached per previous token. Measured there on SmolLM2, 100 tokens:
a watermarked step (list, 12k-entry bias through the API, added on the server) took about 13 ms
more than a plain ``shaped_step`` (about 113 against 100 ms), 4 of them the list.

detect tokenizes TEXT and scores every token after the first against the list its predecessor
seeds: z = (green - GAMMA * T) / sqrt(T * GAMMA * (1 - GAMMA)) over the T tokens scored; plain
text gives |z| of about 1 or less, watermarked text grows with its length (z >= 4 is the paper's
threshold). Each mode sends one JSON message: generate {"text", "tokens", "green", "scored", "z",
"ms_lists", "ms_total"} (z over the generated tokens, the first scored against the prompt's last
token; ms_lists: the time spent building green lists), detect {"green", "scored", "z"}.
"""

import argparse
import json
import math

import inferlet
from inferlet.arguments import number, text, whole

DEFAULT_KEY = 15485863
MAX_CACHED = 1024  # green lists kept (per previous token)


ARGS = inferlet.ArgumentParser("watermark", __doc__)
ARGS.add_argument("mode", choices=["generate", "detect"],
                  help="generate watermarked text after TEXT, or detect the watermark in TEXT")
ARGS.add_argument("text", metavar="TEXT", type=text, help="generate: the prompt; detect: the text scored")
ARGS.add_argument("max_new_tokens", metavar="MAX_NEW_TOKENS", nargs="?", type=whole(0), default=200,
                  help="generate: tokens at most (default %(default)s)")
ARGS.add_argument("--gamma", metavar="G", type=number(above=0, below=1), default=0.25,
                  help="the green fraction of the vocabulary (default %(default)s)")
ARGS.add_argument("--key", metavar="K", type=int, default=DEFAULT_KEY,
                  help="the secret key of the green lists (default %(default)s)")
ARGS.add_argument("--delta", metavar="D", type=number(), default=2.0,
                  help="generate: added to the green tokens' logits (default %(default)s)")
ARGS.add_argument("--temperature", metavar="T", type=number(0), default=1.0,
                  help="generate: the sampling temperature (default %(default)s)")
ARGS.add_argument("--seed", metavar="S", type=int, default=0, help="generate: the sampler's seed (default %(default)s)")
ARGS.add_argument("--chat", action="store_true", help="generate: TEXT is a user turn of the chat template")
ARGS.add_argument("--ignore-eos", action="store_true",
                  help="generate: ban the end tokens, so exactly MAX_NEW_TOKENS are drawn")


def smallest_prime_from(n: int) -> int:
    def prime(m: int) -> bool:
        return m > 1 and all(m % d for d in range(2, math.isqrt(m) + 1))
    while not prime(n):
        n += 1
    return n


class Watermark:
    def __init__(self, vocab_size: int, gamma: float, key: int):
        self.vocab_size, self.gamma, self.key = vocab_size, gamma, key
        self.prime = smallest_prime_from(vocab_size)
        self.cut = round(gamma * self.prime)
        self._lists: dict[int, list[int]] = {}

    def split(self, prev: int) -> tuple[int, int]:
        """The affine map (a, b) that ``prev`` seeds."""
        rng = inferlet.Rng(self.key * 2**32 + prev)
        return 1 + rng.next_u64() % (self.prime - 1), rng.next_u64() % self.prime

    def is_green(self, prev: int, token: int) -> bool:
        a, b = self.split(prev)
        return (a * token + b) % self.prime < self.cut

    def green_list(self, prev: int) -> list[int]:
        green = self._lists.get(prev)
        if green is None:
            a, b = self.split(prev)
            p, inverse = self.prime, pow(a, self.prime - 2, self.prime)
            start = -b * inverse % p  # green[k] = (k - b) / a mod p: an arithmetic progression mod p
            green = [x % p for x in range(start, start + self.cut * inverse, inverse)]
            for k in sorted(((a * v + b) % p for v in range(self.vocab_size, p)), reverse=True):
                if k < self.cut:  # the few values of the map past the vocabulary
                    del green[k]
            if len(self._lists) >= MAX_CACHED:
                self._lists.clear()
            self._lists[prev] = green
        return green

    def z_score(self, prevs: list[int], tokens: list[int]) -> tuple[int, int, float]:
        """(green tokens, tokens scored, z) of ``tokens``, each after its ``prevs`` entry."""
        scored = len(tokens)
        green = sum(self.is_green(prev, token) for prev, token in zip(prevs, tokens))
        g = self.gamma
        z = (green - g * scored) / math.sqrt(scored * g * (1 - g)) if scored else 0.0
        return green, scored, z


async def generate(opt: argparse.Namespace, mark: Watermark) -> dict:
    delta = opt.delta
    sampler = inferlet.Temperature(opt.temperature, opt.seed)
    banned = {t: float("-inf") for t in inferlet.stop_tokens()} if opt.ignore_eos else {}
    stops = inferlet.stop_tokens()
    start, ms_lists = inferlet.now_ms(), 0
    with inferlet.Context() as ctx:
        ctx.fill_chat([{"role": "user", "content": opt.text}]) if opt.chat else ctx.fill(opt.text)
        first_prev = prev = ctx.pending[-1]
        tokens: list[int] = []
        for _ in range(opt.max_new_tokens):
            bias = {}
            if delta:
                before = inferlet.now_ms()
                bias = dict.fromkeys(mark.green_list(prev), delta)
                ms_lists += inferlet.now_ms() - before
            bias.update(banned)
            prev = await ctx.shaped_step(inferlet.Shape(bias=bias), sampler)
            tokens.append(prev)
            if prev in stops:
                break
    green, scored, z = mark.z_score([first_prev] + tokens[:-1], tokens)
    text = inferlet.decode([t for t in tokens if t not in stops])
    return {"text": text, "tokens": tokens, "green": green, "scored": scored, "z": z, "ms_lists": ms_lists,
            "ms_total": inferlet.now_ms() - start}


def detect(opt: argparse.Namespace, mark: Watermark) -> dict:
    tokens = inferlet.encode(opt.text)
    green, scored, z = mark.z_score(tokens[:-1], tokens[1:])
    return {"green": green, "scored": scored, "z": z}


async def main(args: list[str]) -> None:
    opt = ARGS.parse(args)
    mark = Watermark(inferlet.vocab_size(), opt.gamma, opt.key)
    result = await generate(opt, mark) if opt.mode == "generate" else detect(opt, mark)
    inferlet.send(json.dumps(result))


WitWorld = inferlet.run(main)

"""Generated tasks on the demo tools: varied requests of one to four independent chains.

A chain is a single call (weather, stock price, currency conversion, local time, arithmetic, web
search) or a dependent one (a price converted to another currency, a temperature in Fahrenheit,
the cost of several shares). Requests are phrased in many ways, and same-kind requests may share
a clause ("the weather in Paris and in Tokyo"). Entities come from the split's pools
(:func:`~.split.demo_pools`), so evaluation tasks name cities, symbols, currencies and queries
that no training task does.

Training tasks (``TRAINING_MIX``) have more chains and more dependent ones than evaluation tasks,
name a made-up or rare entity (:mod:`.names`) as often as a real one, and a few are small talk
or off-topic requests that need no call. Evaluation tasks are drawn exactly as before any of that: the same seed gives
the same held-out tasks.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass

from ..tools import demo_registry
from ..tools.demo import CURRENCIES, TIME_ZONES
from .names import NameMaker, Words
from .split import Pools, demo_pools
from .tasks import FollowUp, Subtask, Task, fixed_call, no_call

NUM_SUBTASKS_WEIGHTS = {1: 0.3, 2: 0.35, 3: 0.25, 4: 0.1}
FOLLOW_UP_PROBABILITY = 0.15  # training tasks of 2+ chains whose last one the user adds mid-way (§6.6)


@dataclass(frozen=True)
class TrainingMix:
    """How training tasks differ from evaluation tasks (which keep the defaults of the makers)."""

    num_subtasks_weights: tuple[float, ...] = (0.2, 0.3, 0.3, 0.2)  # of 1, 2, 3, 4 chains
    dependent_weight: float = 2.0    # each dependent chain kind's weight (evaluation: 1-1.5)
    made_up: float = 0.5             # chance that an entity is made up or rare (names.py)
    small_talk: float = 0.03         # chance that a task needs no call
    contrast: float = 0.0            # chance that a task holds a request and a same-kind one that needs a next call
    off_topic: float = 0.0           # chance that a task is a request none of the tools serves (OFF_TOPIC_TRAIN)

    def __post_init__(self) -> None:
        if self.dependent_weight < 0:
            raise ValueError(f"the dependent chains' weight must be >= 0, got {self.dependent_weight}")
        for name in ("made_up", "small_talk", "contrast", "off_topic"):
            if not 0 <= getattr(self, name) <= 1:
                raise ValueError(f"{name.replace('_', '-')} is a chance, between 0 and 1; got {getattr(self, name)}")


TRAINING_MIX = TrainingMix()
_SMALL_TALK = (
    ("Hi!", "Hello! I can look up the weather, stock prices, exchange rates and the time, calculate and search "
            "the web for you."),
    ("Hello, who are you?", "I am an assistant that calls functions: weather, stock prices, currency "
                            "conversion, the time, arithmetic and web search."),
    ("Thanks!", "You are welcome!"),
    ("Thank you, that is all.", "You are welcome. Have a nice day!"),
    ("What can you do?", "I can check the weather, stock prices, exchange rates and the local time, do "
                         "arithmetic and search the web."),
    ("Good morning!", "Good morning! What would you like me to look up?"),
)
# Requests beside the demo tools that none of them serves (issue 43: "Tell me a joke" called
# get_stock_price). Training draws from the first list; the second is held out for
# bench/asynclm_abstain.py. The replies are short answers of the project's own writing.
OFF_TOPIC_TRAIN = (
    ("Write a limerick about a cat.", "A cat with a taste for the cream\nwould plot and would purr and would scheme;\n"
                                       "she tipped the jug over,\nthen rolled in the clover,\nand napped in a warm sunny beam."),
    ("Tell me a fun fact.", "Octopuses have three hearts and blue blood."),
    ("Give me a synonym for happy.", "Joyful."),
    ("Translate 'good night' into Spanish.", "Buenas noches."),
    ("Suggest a name for my new puppy.", "How about Biscuit?"),
    ("Write one sentence about autumn.", "Autumn paints the trees in red and gold before the first frost."),
    ("What is the opposite of ancient?", "Modern."),
    ("Can you recommend a good book?", "Try \"The Hobbit\" by J. R. R. Tolkien."),
    ("Tell me a riddle.", "What has keys but cannot open locks? A piano."),
    ("Write a short poem about the moon.", "Silver moon above the hill,\nthe night is calm, the air is still."),
    ("How do I say thank you in French?", "Merci."),
    ("Give me a tip for sleeping better.", "Go to bed at the same time every night and keep screens out of the bedroom."),
    ("What rhymes with light?", "Night, bright, kite and sight."),
    ("Write a motto for a bakery.", "Fresh from our oven to your table."),
    ("Tell me something nice.", "You are doing great, and your questions are good ones."),
    ("Summarize the story of Cinderella in one sentence.",
     "A kind young woman, helped by her fairy godmother, goes to the ball and marries the prince."),
    ("What is a good name for a pirate ship?", "The Salty Gull."),
    ("Give me an idea for a birthday present.", "A book by their favourite author, with a note inside."),
    ("Write a tongue twister.", "Six slim swans swam swiftly south."),
    ("Describe the color blue to me.", "Blue is the color of a clear sky and of the deep sea: cool and calm."),
    ("Spell the word necessary.", "N-E-C-E-S-S-A-R-Y."),
    ("What is the plural of mouse?", "Mice."),
    ("Tell me a story in two sentences.", "A lighthouse keeper found a message in a bottle. It was the one he had "
                                          "thrown into the sea as a boy."),
    ("Help me start an email to my boss.", "Dear Ms. Smith, I hope this message finds you well."),
)
OFF_TOPIC_HELD_OUT = (
    "Tell me a joke.",
    "Write a haiku about the sea.",
    "What is a good name for a cat?",
    "Translate 'thank you' into German.",
    "Write a short poem about rain.",
    "Give me a synonym for big.",
    "Tell me an interesting fact about space.",
    "Suggest a title for my essay about friendship.",
    "What rhymes with cat?",
    "Write a sentence about summer.",
)
_PLACE_BY_ZONE = {"UTC": "UTC", "Europe/London": "London", "Europe/Paris": "Paris", "Europe/Berlin": "Berlin",
                  "America/New_York": "New York", "America/Chicago": "Chicago",
                  "America/Los_Angeles": "Los Angeles", "Asia/Tokyo": "Tokyo", "Asia/Shanghai": "Shanghai",
                  "Asia/Kolkata": "Kolkata", "Australia/Sydney": "Sydney"}
_OPS = {"+": ("plus", "added to"), "-": ("minus",), "*": ("times", "multiplied by"), "/": ("divided by",)}
_PREFIXES = ("", "", "", "Please tell me: ", "Quick question: ", "Hi! ", "Can you check: ", "I need to know: ")


def _num(value) -> str:
    """A number as the tools' JSON writes it (and so as the answer must repeat it)."""
    return json.dumps(value)


@dataclass(frozen=True)
class _Part:
    """A chain with the clause that asks for it; ``kind``/``entity`` let same-kind clauses merge."""

    subtask: Subtask
    clause: str
    kind: str = ""
    entity: str = ""


class DemoTaskMaker:
    """Tasks of ``split``; training tasks follow ``mix`` and take made-up names from ``words``."""

    def __init__(self, split: str, rng: random.Random, words: Words | None = None,
                 mix: TrainingMix = TRAINING_MIX):
        self.split, self.rng = split, rng
        self.pools: Pools = demo_pools(split, CURRENCIES)
        self.training = split == "train"
        self.mix = mix
        self._makers = {self._weather: 3, self._stock: 2, self._convert: 2, self._time: 1.5, self._calculate: 1.5,
                        self._search: 1, self._stock_in_currency: 1.5, self._fahrenheit: 1, self._shares: 1}
        self._count_weights = dict(NUM_SUBTASKS_WEIGHTS)
        # same-kind pairs, the second needing a next call (TrainingMix.contrast)
        self._contrasts = ((self._weather, self._fahrenheit), (self._stock, self._shares),
                           (self._stock, self._stock_in_currency))
        if self.training:
            for maker in (self._stock_in_currency, self._fahrenheit, self._shares):
                self._makers[maker] = mix.dependent_weight
            self._count_weights = dict(zip(NUM_SUBTASKS_WEIGHTS, mix.num_subtasks_weights))
            held = demo_pools("eval", CURRENCIES)
            self.names = NameMaker(rng, words or Words((), ()), set(held.cities + held.symbols + held.search_queries
                                                                    + held.held_out_currencies))

    def make(self, task_id: str, follow_up: bool = False) -> Task:
        no_call_pool = None
        if self.training and self.rng.random() < self.mix.small_talk:
            no_call_pool = _SMALL_TALK
        # drawn only when asked for, so that data made before the option has the same bytes
        elif self.training and self.mix.off_topic and self.rng.random() < self.mix.off_topic:
            no_call_pool = OFF_TOPIC_TRAIN
        if no_call_pool:
            question, reply = self.rng.choice(no_call_pool)
            return Task(task_id, "demo", question, (no_call(reply),), demo_registry)
        count = self.rng.choices(list(self._count_weights), weights=list(self._count_weights.values()))[0]
        parts: list[_Part] = []
        contrast = self.training and self.mix.contrast > 0 and self.rng.random() < self.mix.contrast
        if contrast:
            # "the weather in A and the temperature in B in Fahrenheit": whether a result needs a next
            # call is read from the request, not from what followed the result before it
            parts = [maker() for maker in self.rng.sample(self.rng.choice(self._contrasts), 2)]
            count = max(count, 2)
        while len(parts) < count:
            maker = self.rng.choices(list(self._makers), weights=list(self._makers.values()))[0]
            part = maker()
            if all(part.clause != p.clause for p in parts):
                parts.append(part)
        if contrast:  # the pair anywhere among the requests
            self.rng.shuffle(parts)
        late = parts.pop() if follow_up and len(parts) > 1 else None
        return Task(task_id, "demo", self._question(parts), tuple(p.subtask for p in parts), demo_registry,
                    FollowUp(f"Also, {late.clause}?", late.subtask) if late else None)

    # -- phrasing ----------------------------------------------------------------------------
    def _question(self, parts: list[_Part]) -> str:
        clauses, i = [], 0
        while i < len(parts):  # consecutive weather (or stock) requests share one clause
            j = i + 1
            while j < len(parts) and parts[i].kind in ("weather", "stock") and parts[j].kind == parts[i].kind:
                j += 1
            clauses.append(self._merged(parts[i:j]) if j - i > 1 else parts[i].clause)
            i = j
        text = clauses[0] if len(clauses) == 1 else ", ".join(clauses[:-1]) + " and " + clauses[-1]
        prefix = self.rng.choice(_PREFIXES)
        text = prefix + (text if prefix else text[0].upper() + text[1:])
        asks = text.split()[0].lower().rstrip(":!") in ("what", "what's", "how", "is")
        return text + ("?" if asks or prefix else ".")

    def _merged(self, parts: list[_Part]) -> str:
        names = [p.entity for p in parts]
        listed = ", ".join(names[:-1]) + " and " + names[-1]
        if parts[0].kind == "weather":
            return self.rng.choice(["what is the weather in " + listed.replace(" and ", " and in "),
                                    "how is the weather in " + listed])
        return self.rng.choice([f"what are {listed} trading at", f"the stock prices of {listed}"])

    def _amount(self):
        return self.rng.randint(1, 2000) if self.rng.random() < 0.7 else round(self.rng.uniform(1, 2000), 2)

    def _city(self) -> str:
        if self.training and self.rng.random() < self.mix.made_up:
            return self.names.city()
        return self.rng.choice(self.pools.cities)

    def _symbol(self) -> str:
        if self.training and self.rng.random() < self.mix.made_up:
            return self.names.symbol()
        return self.rng.choice(self.pools.symbols)

    def _query(self) -> str:
        if self.training and self.rng.random() < self.mix.made_up:
            return self.names.query()
        return self.rng.choice(self.pools.search_queries)

    def _currency_pair(self) -> tuple[str, str]:
        while True:
            pair = tuple(self.rng.sample(self.pools.currencies, 2))
            if self.split == "train" or set(pair) & set(self.pools.held_out_currencies):
                return pair

    # -- chains ------------------------------------------------------------------------------
    def _weather(self) -> _Part:
        city = self._city()
        clause = self.rng.choice([f"what is the weather in {city}", f"how is the weather in {city}",
                                  f"what's the weather like in {city}", f"tell me the weather in {city}",
                                  f"is it warm in {city} today", f"the current weather in {city}"])
        return _Part(Subtask((fixed_call(f'get_weather(city="{city}")'),),
                             lambda r: f"In {city} it is {_num(r[0]['temperature_c'])} °C and {r[0]['conditions']}.",
                             lambda r: [_num(r[0]["temperature_c"]), r[0]["conditions"]]),
                     clause, "weather", city)

    def _stock(self) -> _Part:
        symbol = self._symbol()
        clause = self.rng.choice([f"what is {symbol} trading at", f"the price of {symbol}",
                                  f"how much is one {symbol} share", f"the {symbol} stock price",
                                  f"look up the share price of {symbol}"])
        return _Part(Subtask((fixed_call(f'get_stock_price(symbol="{symbol}")'),),
                             lambda r: f"{symbol} trades at {_num(r[0]['price_usd'])} USD.",
                             lambda r: [_num(r[0]["price_usd"])]),
                     clause, "stock", symbol)

    def _convert(self) -> _Part:
        amount, (src, dst) = _num(self._amount()), self._currency_pair()
        clause = self.rng.choice([f"what is {amount} {src} in {dst}", f"convert {amount} {src} to {dst}",
                                  f"how much is {amount} {src} in {dst}", f"change {amount} {src} into {dst}"])
        call = f'convert_currency(amount={amount}, from_currency="{src}", to_currency="{dst}")'
        return _Part(Subtask((fixed_call(call),), lambda r: f"{amount} {src} is {_num(r[0]['amount'])} {dst}.",
                             lambda r: [_num(r[0]["amount"])]), clause)

    def _time(self) -> _Part:
        zone = self.rng.choice(TIME_ZONES)
        place = self.rng.choice([zone, _PLACE_BY_ZONE[zone]])
        clause = self.rng.choice([f"what time is it in {place}", f"the local time in {place}",
                                  f"what is the current time in {place}"])
        return _Part(Subtask((fixed_call(f'get_time(timezone="{zone}")'),),
                             lambda r: f"The time in {place} is {r[0]}.", lambda r: [r[0]]), clause)

    def _calculate(self) -> _Part:
        op = self.rng.choice(list(_OPS))
        b = self.rng.randint(2, 99)
        a = b * self.rng.randint(2, 60) if op == "/" and self.rng.random() < 0.7 else self.rng.randint(2, 999)
        expression = f"{a} {op} {b}"
        clause = self.rng.choice([f"what is {a} {self.rng.choice(_OPS[op])} {b}", f"calculate {expression}",
                                  f"compute {expression}"])
        return _Part(Subtask((fixed_call(f'calculate(expression="{expression}")'),),
                             lambda r: f"{expression} = {_num(r[0])}.", lambda r: [_num(r[0])]), clause)

    def _search(self) -> _Part:
        query = self._query()
        clause = self.rng.choice([f"search the web for {query}", f"look up {query} online",
                                  f"find web pages about {query}"])
        return _Part(Subtask((fixed_call(f'search_web(query="{query}")'),),
                             lambda r: f"Top result for {query}: {r[0][0]['title']} ({r[0][0]['url']}).",
                             lambda r: [r[0][0]["title"]]), clause)

    def _stock_in_currency(self) -> _Part:
        symbol = self._symbol()
        dst = self._currency_pair()[1] if self.split == "eval" else self.rng.choice(
            [c for c in self.pools.currencies if c != "USD"])
        clause = self.rng.choice([f"what is one {symbol} share worth in {dst}", f"the price of {symbol} in {dst}",
                                  f"how much is {symbol} in {dst}"])
        steps = (fixed_call(f'get_stock_price(symbol="{symbol}")'),
                 lambda r: f'convert_currency(amount={_num(r[0]["price_usd"])}, from_currency="USD", '
                           f'to_currency="{dst}")')
        return _Part(Subtask(steps, lambda r: f"{symbol} trades at {_num(r[0]['price_usd'])} USD, "
                                              f"which is {_num(r[1]['amount'])} {dst}.",
                             lambda r: [_num(r[0]["price_usd"]), _num(r[1]["amount"])]), clause)

    def _fahrenheit(self) -> _Part:
        city = self._city()
        clause = self.rng.choice([f"what is the temperature in {city} in Fahrenheit",
                                  f"how warm is it in {city} in degrees Fahrenheit"])
        steps = (fixed_call(f'get_weather(city="{city}")'),
                 lambda r: f'calculate(expression="{_num(r[0]["temperature_c"])} * 9 / 5 + 32")')
        return _Part(Subtask(steps, lambda r: f"In {city} it is {_num(r[0]['temperature_c'])} °C "
                                              f"({_num(r[1])} °F) and {r[0]['conditions']}.",
                             lambda r: [_num(r[0]["temperature_c"]), _num(r[1])]), clause)

    def _shares(self) -> _Part:
        symbol, count = self._symbol(), self.rng.randint(2, 50)
        clause = self.rng.choice([f"how much do {count} shares of {symbol} cost",
                                  f"what would {count} {symbol} shares cost"])
        steps = (fixed_call(f'get_stock_price(symbol="{symbol}")'),
                 lambda r: f'calculate(expression="{_num(r[0]["price_usd"])} * {count}")')
        return _Part(Subtask(steps, lambda r: f"{count} shares of {symbol} cost {_num(r[1])} USD "
                                              f"({_num(r[0]['price_usd'])} USD each).",
                             lambda r: [_num(r[1])]), clause)

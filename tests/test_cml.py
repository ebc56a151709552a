"""The CML token monitor (inferlets/asynclm/cml.py) on hand-written token traces and on SmolLM2's tokenizer.

Each trace step is ``(token text, events that token completes, in_critical_section after it)``.
At every state a trace reaches, every token that would complete ``[INTR]`` must be refused.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "inferlets" / "asynclm"))

from cml import Call, Malformed, Text, TokenMonitor, Trap

# Tokens that complete [INTR] from some state, whole or split; the traces add their own tokens.
INTR_PROBES = ["[INTR]", " [INTR] a", "[", "[IN", " [INT", "IN", "TR", "R", "]", "R]", "TR]", "NTR]", "R]\n",
               "][", "RO"]
OTHER_PROBES = ["[CALL]", "[HEAD]", "[END]", "[TRAP]", " [HEAD]", "[E", "[C", "Hello", " ", "\n", "f(1)"]


class FakeVocab:
    """Token ids for hand-written token texts; counts look-ups to check the monitor memoises."""

    def __init__(self, texts=()):
        self.texts: list[str] = []
        self.id_by_text: dict[str, int] = {}
        self.num_lookups = 0
        for text in [*INTR_PROBES, *OTHER_PROBES, *texts]:
            self.id(text)

    def id(self, text: str) -> int:
        if text not in self.id_by_text:
            self.id_by_text[text] = len(self.texts)
            self.texts.append(text)
        return self.id_by_text[text]

    def __call__(self, token_id: int) -> str:
        self.num_lookups += 1
        return self.texts[token_id]


def completes_intr(fed: str, text: str) -> bool:
    # The traces never contain [INTR] themselves, so any occurrence must end in `text`.
    return "[INTR]" in fed[-5:] + text


def run_trace(steps, monitor=None, vocab=None):
    """Feed each step's token, checking its events, the critical-section flag and the [INTR] guard."""
    vocab = vocab or FakeVocab(text for text, _, _ in steps)
    monitor = monitor or TokenMonitor(vocab)
    fed = ""
    for text, expected_events, expected_critical in steps:
        for probe_id, probe in enumerate(vocab.texts):
            if completes_intr(fed, probe):
                assert not monitor.allowed(probe_id), (fed, probe)
        assert monitor.allowed(vocab.id(text)), (fed, text)
        assert monitor.feed(vocab.id(text)) == expected_events, (fed, text)
        assert monitor.in_critical_section is expected_critical, (fed, text)
        fed += text
    return monitor, vocab


def test_call_split_across_tokens_is_emitted_at_its_end_token():
    monitor, _ = run_trace([
        ("Hi ", [Text("Hi ")], False),
        ("[", [], True),  # might start a delimiter: held back, and no interrupt may split it
        ("CA", [], True),
        ("LL", [], True),
        ("]", [], True),
        (" job1 ", [], True),
        ("[", [], True),
        ("HE", [], True),
        ("AD", [], True),
        ("]", [], True),
        (' get_weather(city="Paris") ', [], True),
        ("[", [], True),
        ("END", [], True),
        ("]", [Call("job1", 'get_weather(city="Paris")')], False),
        (" done", [Text(" done")], False),
    ])
    assert monitor.flush() == []


def test_delimiters_merged_with_neighbouring_text():
    run_trace([
        (" Hello [CA", [Text(" Hello ")], True),
        ("LL] a [HE", [], True),
        ("AD] f(1) [END]\n", [Call("a", "f(1)"), Text("\n")], False),
    ])


def test_several_calls_in_order_with_and_without_ids():
    run_trace([
        ("[CALL] a [HEAD] f(1) [END]", [Call("a", "f(1)")], False),
        (" and ", [Text(" and ")], False),
        ("[CALL]", [], True),
        (" g(2", [], True),
        (")[", [], True),
        ("END]", [Call(None, "g(2)")], False),
        ("[CALL] h() [END][CALL] b", [Call(None, "h()")], True),
        (" [HEAD] h(x=[1, 2], y='[CAT]') ", [], True),
        ("[END]", [Call("b", "h(x=[1, 2], y='[CAT]')")], False),
    ])


def test_trap_then_end_only():
    vocab = FakeVocab()
    monitor, _ = run_trace(vocab=vocab, steps=[
        ("Wait.", [Text("Wait.")], False),
        (" [", [Text(" ")], True),
        ("TR", [], True),
        ("AP", [], True),
    ])
    ids = vocab.id
    assert monitor.next_forced() is None  # "[TRAP" might still turn out to be text
    monitor, _ = run_trace([("][", [], True)], monitor, vocab)
    assert monitor.next_forced() == "END]"
    assert not monitor.allowed(ids("AP")) and not monitor.allowed(ids("["))
    run_trace([("END", [], True), ("]", [Trap()], False), ("\n", [Text("\n")], False)], monitor, vocab)
    assert monitor.next_forced() is None

    monitor = TokenMonitor(vocab)
    monitor.feed_text("[TRAP]")
    assert monitor.next_forced() == "[END]"
    probes = [" ", "\n", "[", "[E", "[END]", "Hello", "[C", "[CALL]", "[TRAP]", "f(1)"]
    assert [monitor.allowed(ids(t)) for t in probes] == [True, True, True, True, True] + [False] * 5


def test_brackets_that_are_not_delimiters_are_text():
    monitor, _ = run_trace([
        ("x = [1, 2]", [Text("x = [1, 2]")], False),
        (" [CAT]", [Text(" [CAT]")], False),
        (" [", [Text(" ")], True),
        ("CA", [], True),
        ("T", [Text("[CAT")], False),
        ("]", [Text("]")], False),
        (" [END", [Text(" ")], True),
        ("ING", [Text("[ENDING")], False),
        (" [[", [Text(" [")], True),
        ("x", [Text("[x")], False),
        (" [C", [Text(" ")], True),
    ])
    assert monitor.flush() == [Text("[C")]
    assert not monitor.in_critical_section


def test_intr_cannot_be_sampled_even_split_or_merged():
    vocab = FakeVocab()
    ids = vocab.id
    monitor, _ = run_trace([("[", [], True), ("IN", [], True), ("TR", [], True)], vocab=vocab)
    assert not monitor.allowed(ids("]")) and not monitor.allowed(ids("]["))
    assert monitor.allowed(ids("R]"))  # "[INTRR]" is text
    assert monitor.choose([ids("]"), ids("]["), ids("RO"), ids("f(1)")]) == ids("RO")
    assert monitor.choose([ids("]"), ids("][")]) is None

    monitor, _ = run_trace([("Hello", [Text("Hello")], False), (" [INT", [Text(" ")], True)], vocab=vocab)
    assert not monitor.allowed(ids("R]\n")) and not monitor.allowed(ids("R]"))
    assert monitor.choose([ids("R]\n"), ids("RO")]) == ids("RO")
    assert monitor.feed(ids("RO")) == [Text("[INTRO")]

    # Inside a call block too.
    monitor, _ = run_trace([("[CALL] a [HEAD] f(", [], True), ("[IN", [], True)], vocab=vocab)
    assert not monitor.allowed(ids("TR]")) and not monitor.allowed(ids("[INTR]"))


def test_delimiters_allowed_by_place():
    vocab = FakeVocab(["[CALL] a", "[CALL] a [HEAD] f(1)"])
    allowed = lambda monitor, text: monitor.allowed(vocab.id(text))
    names = ["[CALL]", "[HEAD]", "[END]", "[TRAP]", "[INTR]"]

    outside = TokenMonitor(vocab)
    assert [allowed(outside, n) for n in names] == [True, False, False, True, False]
    before_head = TokenMonitor(vocab)
    before_head.feed(vocab.id("[CALL] a"))
    assert [allowed(before_head, n) for n in names] == [False, True, True, False, False]
    after_head = TokenMonitor(vocab)
    after_head.feed(vocab.id("[CALL] a [HEAD] f(1)"))
    assert [allowed(after_head, n) for n in names] == [False, False, True, False, False]


@pytest.mark.parametrize("head, fresh", [("b", True), (" job_1 ", True), ("", False), ("  ", False),
                                         ("for", False), ("job 1", False), ("1job", False), ("f(x)", False),
                                         ("used", False), ("a", False)])
def test_head_needs_a_fresh_identifier(head, fresh):
    vocab = FakeVocab()
    monitor = TokenMonitor(vocab, used_ids=["used"])  # e.g. ids from earlier turns
    monitor.feed(vocab.id("[CALL] a [HEAD] f() [END]"))
    monitor.feed(vocab.id(f"[CALL]{head}"))
    assert monitor.allowed(vocab.id("[HEAD]")) is fresh
    assert monitor.allowed(vocab.id(" [HEAD]")) is fresh
    assert monitor.allowed(vocab.id("[END]"))  # the text may still be an anonymous call


@pytest.mark.parametrize("fed, token, named", [
    ("", "[CALL] w1", True), ("[CALL]", " get", True), ("[CALL] get", "_weather", True), ("[CALL] w1", " [", True),
    ("[CALL] w1 [", "HEAD", True), ("[CALL] w1", " [HEAD]", True), ("[CALL] w1 [HEAD]", " f(1)", True),
    ("[CALL] w1 [", "END", False), ("[CALL] w1", "[END]", False), ("[CALL] w1", " [HEAD] f", False),
    ("[CALL] w1", " [HEAD]\n", False), ("[CALL] w1", "(", False), ("[CALL] w1", " x", False),
    ("", "[CALL] f(", False), ("[CALL] get", "_weather(", False), ("[CALL] w1 [", "C", False)])
def test_named_calls_allow_only_an_id_then_head_ending_its_token(fed, token, named):
    """--constrain: no anonymous call, and the call text after [HEAD] starts on a token of its own
    (the grammar's generation starts there); a monitor without named_calls allows each of these."""
    vocab = FakeVocab([fed, token])
    monitors = TokenMonitor(vocab, named_calls=True), TokenMonitor(vocab)
    for monitor in monitors:
        monitor.feed(vocab.id(fed))
    assert [m.allowed(vocab.id(token)) for m in monitors] == [named, True]


def test_the_call_body_starts_right_after_head():
    vocab = FakeVocab(["[CALL] w1", " [HEAD]", " f(1)", " [END]"])
    monitor = TokenMonitor(vocab, named_calls=True)
    starts = []
    for text in ["[CALL] w1", " [HEAD]", " f(1)", " [END]"]:
        monitor.feed(vocab.id(text))
        starts.append(monitor.call_body_start)
    assert starts == [False, True, False, False]


def test_duplicate_id_refused_at_head_split_across_tokens():
    steps = [("[CALL] a [HEAD] f() [END]", [Call("a", "f()")], False), (" [CALL] a ", [Text(" ")], True),
             ("[", [], True), ("HE", [], True), ("AD", [], True)]
    monitor, vocab = run_trace(steps)
    assert not monitor.allowed(vocab.id("]"))
    # Forced anyway, the [HEAD] is reported and ignored; the block stays open and then fails to parse.
    assert monitor.feed(vocab.id("]")) == [Malformed("[HEAD]", "call id 'a' is already used")]
    assert monitor.feed_text(" g() [END]") == [Malformed("a  g()", "call is not valid Python: invalid syntax")]


@pytest.mark.parametrize("cml, reason", [
    ("[CALL] a [HEAD] f( [END]", "call is not valid Python: '(' was never closed"),
    ("[CALL] x + 1 [END]", "not a Python call expression"),
    ("[CALL] job1 [END]", "not a Python call expression"),
    ("[CALL] b [HEAD] [END]", "call is not valid Python: invalid syntax"),
])
def test_malformed_call_still_closes_the_block(cml, reason):
    monitor = TokenMonitor(lambda i: "")
    events = monitor.feed_text(cml)
    assert len(events) == 1 and isinstance(events[0], Malformed) and events[0].reason == reason
    assert not monitor.in_critical_section
    assert monitor.feed_text(" next") == [Text(" next")]


def test_misplaced_delimiters_when_forced():
    monitor = TokenMonitor(lambda i: "")
    assert monitor.feed_text("a [END] b") == [Text("a "), Malformed("[END]", "[END] is not allowed outside a block"),
                                             Text(" b")]
    assert monitor.feed_text("[TRAP] x [CALL]") == [
        Malformed(" x ", "text after [TRAP]; only [END] may follow"),
        Malformed("[CALL]", "[CALL] is not allowed after [TRAP]"),
    ]
    assert monitor.feed_text("[END]") == [Trap()]


def test_forced_interrupt_is_consumed_silently():
    monitor = TokenMonitor(lambda i: "")
    assert monitor.feed_text("[CALL] a [HEAD] f(1) [END]") == [Call("a", "f(1)")]
    assert not monitor.in_critical_section and not monitor.interruptible  # out of the block, mid-line
    monitor.feed_text("\n")
    assert monitor.interruptible  # an interrupt may go in now
    assert monitor.feed_text("[INTR] a [HEAD] [CAT] 21") == []
    assert monitor.in_critical_section
    assert monitor.feed_text(" [END]") == [] and not monitor.in_critical_section
    assert monitor.feed_text("ok") == [Text("ok")]
    assert monitor.feed_text("[CALL] g(") == []
    assert monitor.feed_text("[INTR]") == [Malformed("[INTR]", "[INTR] is not allowed in a [CALL] block")]


def test_flush_reports_an_open_block():
    monitor = TokenMonitor(lambda i: "")
    monitor.feed_text("[CALL] a [HEAD] f(1) [EN")
    assert monitor.flush() == [Malformed(" f(1) [EN", "generation ended after [HEAD] in a [CALL] block")]
    assert not monitor.in_critical_section and monitor.flush() == []


def test_token_text_is_memoised():
    vocab = FakeVocab(["[CA", "LL]"])
    monitor = TokenMonitor(vocab)
    for _ in range(3):
        monitor.allowed(vocab.id("[CA"))
        monitor.choose([vocab.id("LL]"), vocab.id("[CA")])
    assert vocab.num_lookups == 2


# --- SmolLM2's real tokenizer (read from the model folder setup prepared; no weights, no server) ---

@pytest.fixture(scope="module")
def smollm2():
    from oven.control.tokenizer import Tokenizer
    from oven.inference.models import EMBEDDED_MODELS, TOKENIZER_DONOR, cache_dir
    from oven.proto.inference import TokenizerSpec

    stem = Path(EMBEDDED_MODELS[TOKENIZER_DONOR][1]).stem
    found = sorted((cache_dir() / "models").glob(f"{stem}-*/tokenizer.json"))
    if not found:
        pytest.skip(f"no prepared {TOKENIZER_DONOR} folder under {cache_dir()}; run setup.sh")
    spec = TokenizerSpec(tokenizer_json=found[0].read_text(), chat_template="", bos_token="", eos_token="",
                         stop_token_ids=[])
    tok = Tokenizer(spec)
    token_text = lambda i: tok.decode([i])
    bracket_ids = [i for i in range(tok.vocab_size) if "[" in token_text(i) or "]" in token_text(i)]
    return tok, token_text, bracket_ids


def feed_checked(monitor, token_text, token_ids, bracket_ids):
    """Feed real tokens, each first checked allowed, and at every state refuse all [INTR] completions."""
    events, fed = [], ""
    for token_id in token_ids:
        for probe_id in bracket_ids:  # a token completing [INTR] must contain its "]"
            if completes_intr(fed, token_text(probe_id)):
                assert not monitor.allowed(probe_id), (fed, token_text(probe_id))
        assert monitor.allowed(token_id), (fed, token_text(token_id))
        events += monitor.feed(token_id)
        fed += token_text(token_id)
    return events


def merge_text(events):
    """Join adjacent Text events: how text splits into events depends on the tokenizer."""
    merged = []
    for event in events:
        if merged and isinstance(event, Text) and isinstance(merged[-1], Text):
            event = Text(merged.pop().text + event.text)
        merged.append(event)
    return merged


def test_smollm2_calls_and_trap(smollm2):
    tok, token_text, bracket_ids = smollm2
    text = ('Hello [CALL] job1 [HEAD] get_weather(city="Paris") [END]\n'
            "Then [CALL] add(1, 2)[END] x = [1, 2] [CAT] [TRAP][END]")
    monitor = TokenMonitor(token_text)
    events = feed_checked(monitor, token_text, tok.encode(text), bracket_ids) + monitor.flush()
    assert merge_text(events) == [Text("Hello "), Call("job1", 'get_weather(city="Paris")'), Text("\nThen "),
                                  Call(None, "add(1, 2)"), Text(" x = [1, 2] [CAT] "), Trap()]


def test_smollm2_cannot_write_intr(smollm2):
    tok, token_text, bracket_ids = smollm2
    for prefix in ["Result: [INTR", "[CALL] a [HEAD] f(x=[INTR"]:
        monitor = TokenMonitor(token_text)
        feed_checked(monitor, token_text, tok.encode(prefix), bracket_ids)
        closing = [i for i in bracket_ids if token_text(i).startswith("]")]
        assert closing and not any(monitor.allowed(i) for i in closing)
        assert monitor.choose(closing + tok.encode("O")) == tok.encode("O")[0]
    # [INTR] spelled whole in the text is refused at its "]" token.
    monitor = TokenMonitor(token_text)
    ids = tok.encode(" [INTR] a [HEAD] 1 [END]")
    for token_id in ids[:3]:
        assert monitor.allowed(token_id)
        monitor.feed(token_id)
    assert token_text(ids[3]) == "]" and not monitor.allowed(ids[3])


def test_smollm2_head_refused_for_used_or_bad_ids(smollm2):
    tok, token_text, _ = smollm2
    for head, fresh in [(" b ", True), (" a ", False), (" for ", False), (" f(x) ", False)]:
        monitor = TokenMonitor(token_text)
        assert monitor.feed_text("[CALL] a [HEAD] f() [END]") == [Call("a", "f()")]
        ids = tok.encode(f"[CALL]{head}[HEAD]")
        for token_id in ids[:-1]:
            monitor.feed(token_id)
        assert token_text(ids[-1]) == "]" and monitor.allowed(ids[-1]) is fresh, head


def test_an_interrupt_waits_for_the_end_of_the_line():
    monitor = TokenMonitor(lambda i: "")
    assert monitor.interruptible  # nothing written yet
    for text, interruptible in [("KHI trades", False), (" at 18", False), ("8.87 USD.", False), ("\n", True),
                                ("Next", False), (".\nAnd", False), (" more.\n", True), ("[CALL] f(1) [END]\n", True),
                                ("[TRAP][END]", False), ("\n", True), ("[INTR] a [HEAD] 1 [END]\n", True)]:
        monitor.feed_text(text)
        assert monitor.interruptible is interruptible, text
    monitor.feed_text("[CALL] g(\n")
    assert not monitor.interruptible  # a newline inside a block does not open the way

"""The CML token monitor: a finite-state machine over sampled tokens (AsyncLM §3, §5.1).

CML marks function calls and interrupts in the token stream with five delimiters:

* ``[CALL] id [HEAD] call [END]`` - a call whose result comes back as an interrupt for ``id``;
* ``[CALL] call [END]``           - an anonymous call;
* ``[INTR] id [HEAD] value [END]``- an interrupt, injected by the system and never sampled;
* ``[TRAP][END]``                 - the model waits for pending results.

:class:`TokenMonitor` reads the stream one token at a time and reports what it
finds as events (:class:`Text`, :class:`Call`, :class:`Trap`, :class:`Malformed`).
``allowed`` says whether a token may be sampled so the output stays valid CML,
``in_critical_section`` says whether a block is open, and ``interruptible`` whether an interrupt may
be injected now: outside every block and at the start of a line.

Delimiters are matched on characters, not tokens, because a BPE vocabulary
spells ``[CALL]`` as ``" [", "C", "ALL", "]"`` and merges brackets with their
neighbours (``")["``, ``"]["``). Text that might still become a delimiter is
held back until it cannot.

Before ``[HEAD]`` a block's text is ambiguous: it is the id if ``[HEAD]``
follows and the call itself if ``[END]`` follows. No character is refused
there, so anonymous calls stay possible; ``[HEAD]`` is allowed only while the
text so far is a fresh identifier, so once the text stops being one the block
is committed to the anonymous form. A monitor made with ``named_calls`` (``--constrain``) allows
there only an identifier and then ``[HEAD]``, ending the token that completes it, so that a grammar
can hold the call from exactly that point (:attr:`TokenMonitor.call_body_start`).

Stdlib only: it runs inside the inferlet's CPython in WebAssembly.
"""

from __future__ import annotations

import ast
import keyword
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from enum import Enum

CALL, HEAD, END, INTR, TRAP = "[CALL]", "[HEAD]", "[END]", "[INTR]", "[TRAP]"
DELIMITERS = (CALL, HEAD, END, INTR, TRAP)

_DELIMITER_RE = re.compile("|".join(re.escape(d) for d in DELIMITERS))
# "[" only starts a delimiter, so held-back text is always one of these, starting at the last "[".
_PROPER_PREFIXES = frozenset(d[:i] for d in DELIMITERS for i in range(1, len(d)))


@dataclass(frozen=True)
class Text:
    """Model text outside any CML block, released once it cannot be the start of a delimiter."""

    text: str


@dataclass(frozen=True)
class Call:
    """A function call, emitted when the ``[END]`` of its block is fed; ``call_id`` is None if anonymous."""

    call_id: str | None
    call: str


@dataclass(frozen=True)
class Trap:
    """``[TRAP][END]``: the model waits for the results of pending calls."""


@dataclass(frozen=True)
class Malformed:
    """Fed text that breaks CML: a call that is not a Python call, a misplaced delimiter, an open block."""

    text: str
    reason: str


Event = Text | Call | Trap | Malformed


class Mode(Enum):
    """Where the stream is; the value says so in error messages."""

    TEXT = "outside a block"
    CALL_HEAD = "in a [CALL] block"
    CALL_BODY = "after [HEAD] in a [CALL] block"
    TRAP = "after [TRAP]"
    INTR_HEAD = "in an [INTR] block"
    INTR_BODY = "after [HEAD] in an [INTR] block"


# Every delimiter allowed in a mode and the mode it leads to; a missing pair is a syntax error.
_NEXT_MODE = {
    (Mode.TEXT, CALL): Mode.CALL_HEAD,
    (Mode.TEXT, TRAP): Mode.TRAP,
    (Mode.TEXT, INTR): Mode.INTR_HEAD,
    (Mode.CALL_HEAD, HEAD): Mode.CALL_BODY,
    (Mode.CALL_HEAD, END): Mode.TEXT,
    (Mode.CALL_BODY, END): Mode.TEXT,
    (Mode.TRAP, END): Mode.TEXT,
    (Mode.INTR_HEAD, HEAD): Mode.INTR_BODY,
    (Mode.INTR_BODY, END): Mode.TEXT,
}


def _split(text: str) -> tuple[list[tuple[str, str | None]], str]:
    """Cut ``text`` at delimiters: ``[(text, delimiter), ..., (rest, None)]`` and the held-back tail."""
    pieces, start = [], 0
    for match in _DELIMITER_RE.finditer(text):
        pieces.append((text[start:match.start()], match.group()))
        start = match.end()
    rest, held = text[start:], ""
    cut = rest.rfind("[")
    if cut >= 0 and rest[cut:] in _PROPER_PREFIXES:
        rest, held = rest[:cut], rest[cut:]
    pieces.append((rest, None))
    return pieces, held


def _step(mode: Mode, delimiter: str, block_text: str, used_ids: set[str]) -> tuple[Mode, str | None]:
    """The mode after ``delimiter``, or the unchanged mode and why the delimiter is not allowed."""
    next_mode = _NEXT_MODE.get((mode, delimiter))
    if next_mode is None:
        return mode, f"{delimiter} is not allowed {mode.value}"
    if next_mode is Mode.CALL_BODY:
        call_id = block_text.strip()
        if not call_id.isidentifier():
            return mode, f"call id {call_id!r} is not an identifier"
        if keyword.iskeyword(call_id):
            return mode, f"call id {call_id!r} is a keyword"
        if call_id in used_ids:
            return mode, f"call id {call_id!r} is already used"
    return next_mode, None


def _call_event(call_id: str | None, text: str) -> Call | Malformed:
    call = text.strip()
    try:
        tree = ast.parse(call, mode="eval")
    except (SyntaxError, ValueError) as e:  # ValueError: null bytes, before Python 3.12
        return Malformed(call, f"call is not valid Python: {getattr(e, 'msg', e)}")
    if not isinstance(tree.body, ast.Call):
        return Malformed(call, "not a Python call expression")
    return Call(call_id, call)


class TokenMonitor:
    """Follows one generation's tokens through CML; see the module doc.

    ``token_text`` maps a token id to its decoded text (memoised here). Feed
    every token that enters the context, sampled or forced, interrupts
    included, so the monitor's state matches the context. Forced text may
    break CML where sampled text cannot: a misplaced delimiter is reported as
    :class:`Malformed` and ignored, and so is text between ``[TRAP]`` and ``[END]``.
    Delimiters are ASCII, so a token whose bytes decode to U+FFFD alone is harmless.
    """

    def __init__(self, token_text: Callable[[int], str], used_ids: Iterable[str] = (), named_calls: bool = False):
        self._token_text = token_text
        self._named_calls = named_calls  # no anonymous calls; [HEAD] ends its token (module doc)
        self._text_by_token_id: dict[int, str] = {}
        self._mode = Mode.TEXT
        self._held = ""  # a proper prefix of a delimiter, not yet known to be text
        self._block_parts: list[str] = []  # the open block's text since its last delimiter
        self._call_id: str | None = None
        self._used_ids = set(used_ids)  # ids must stay unique for the whole session
        self._line_open = False  # the context's last line has text: an interrupt would split it

    @property
    def in_critical_section(self) -> bool:
        """True while no interrupt may be injected: a block is open or a delimiter is half written.

        A half-written delimiter counts because ``"[CA" + "[INTR]..."`` would
        break a ``[CALL]`` the model is about to finish.
        """
        return self._mode is not Mode.TEXT or bool(self._held)

    @property
    def interruptible(self) -> bool:
        """True where an interrupt may be injected: outside every block, at the start of a line.

        An interrupt that lands mid-sentence waits for the line's end: a model that must go on with
        "KHI trades" after sixty tokens of someone else's result tends to finish it with the wrong
        number, and one line of text costs a few tokens' latency. The wait is bounded: the model ends
        its line or its turn, and a turn that ends while results are owed becomes a forced
        ``[TRAP][END]`` and a newline.
        """
        return not self.in_critical_section and not self._line_open

    @property
    def call_body_start(self) -> bool:
        """True right after a call's ``[HEAD]``, before any of its call text."""
        return self._mode is Mode.CALL_BODY and not self._block_parts and not self._held

    def allowed(self, token_id: int) -> bool:
        """May ``token_id`` be sampled now? ``[INTR]`` never may; other delimiters per CML."""
        text = self._text(token_id)
        named_head = self._named_calls and self._mode is Mode.CALL_HEAD
        if not self._held and "[" not in text and not named_head:  # the usual case: no delimiter here
            return self._mode is not Mode.TRAP or text.isspace() or not text
        pieces, held = _split(self._held + text)
        mode, block_text = self._mode, None  # the block's text is joined only at a delimiter
        for index, (piece, delimiter) in enumerate(pieces):
            if mode is Mode.TRAP and piece and not piece.isspace():
                return False
            if delimiter is None:
                break
            if delimiter == INTR:
                return False
            if block_text is None:
                block_text = "".join(self._block_parts)
            if self._named_calls and mode is Mode.CALL_HEAD and delimiter != HEAD:
                return False  # an anonymous call (or a misplaced delimiter)
            mode, reason = _step(mode, delimiter, block_text + piece, self._used_ids)
            if reason:
                return False
            if self._named_calls and mode is Mode.CALL_BODY and (index + 2 < len(pieces) or pieces[-1][0] or held):
                return False  # the call text must start on a token of its own
            block_text = ""
        if self._named_calls and mode is Mode.CALL_HEAD:  # only an id so far, then perhaps the start of [HEAD]
            head = ("".join(self._block_parts) if block_text is None else "") + pieces[-1][0]
            return (not head.strip() or head.strip().isidentifier()) and HEAD.startswith(held)
        return mode is not Mode.TRAP or END.startswith(held)

    def choose(self, ranked: Sequence[int]) -> int | None:
        """The first allowed token of ``ranked`` (best first), or None if none is."""
        return next((token_id for token_id in ranked if self.allowed(token_id)), None)

    def feed(self, token_id: int) -> list[Event]:
        """Advance past a sampled or forced token; the events it completes, in order."""
        return self.feed_text(self._text(token_id))

    def feed_text(self, text: str) -> list[Event]:
        """Advance past ``text`` (forced text such as an interrupt); the events it completes."""
        events: list[Event] = []
        if text:
            self._line_open = not text.endswith("\n")
        pieces, self._held = _split(self._held + text)
        for piece, delimiter in pieces:
            self._absorb(piece, events)
            if delimiter is not None:
                self._delimit(delimiter, events)
        return events

    def flush(self) -> list[Event]:
        """End of generation: release held-back text; an open block is reported as Malformed."""
        held, self._held = self._held, ""
        if self._mode is Mode.TEXT:
            return [Text(held)] if held else []
        text = "".join(self._block_parts) + held
        events = [Malformed(text, f"generation ended {self._mode.value}")]
        self._mode, self._block_parts = Mode.TEXT, []
        return events

    def next_forced(self) -> str | None:
        """The rest of a delimiter that must come next (``[END]`` after ``[TRAP]``), or None."""
        if self._mode is Mode.TRAP:
            return END[len(self._held):]
        return None

    def text_of(self, token_id: int) -> str:
        """A token's text (memoised)."""
        return self._text(token_id)

    def _text(self, token_id: int) -> str:
        text = self._text_by_token_id.get(token_id)
        if text is None:
            text = self._text_by_token_id[token_id] = self._token_text(token_id)
        return text

    def _absorb(self, piece: str, events: list[Event]) -> None:
        """Take text that is not a delimiter."""
        if not piece:
            return
        if self._mode is Mode.TEXT:
            events.append(Text(piece))
        elif self._mode is Mode.TRAP:
            if not piece.isspace():
                events.append(Malformed(piece, f"text {Mode.TRAP.value}; only [END] may follow"))
        else:
            self._block_parts.append(piece)

    def _delimit(self, delimiter: str, events: list[Event]) -> None:
        """Take a delimiter: change mode, or report it as Malformed and ignore it (the block stays open)."""
        block_text = "".join(self._block_parts)
        mode, reason = _step(self._mode, delimiter, block_text, self._used_ids)
        if reason:
            events.append(Malformed(delimiter, reason))
            return
        if mode is Mode.CALL_BODY:  # [HEAD] ended the id
            self._call_id = block_text.strip()
            self._used_ids.add(self._call_id)
        elif self._mode in (Mode.CALL_HEAD, Mode.CALL_BODY):  # [END] ended a call
            events.append(_call_event(self._call_id, block_text))
            self._call_id = None
        elif self._mode is Mode.TRAP:
            events.append(Trap())
        self._mode, self._block_parts = mode, []

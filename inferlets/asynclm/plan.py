"""A pinned call sequence (``plan``): which CML text to force next, as the model would write it.

A plan is a list of chains; the calls of a chain depend on each other in order, different
chains do not. Each mode writes it the way that mode's model would:

* ``async`` / ``async-naive``: the next call of any chain whose previous result is in the
  context, longest estimated execution time first (LPT); ``[TRAP][END]`` when none is ready;
* ``sync``: one call at a time (each waits for its result);
* ``sync-parallel``: round k holds the k-th call of every chain, followed by ``[TRAP][END]``.
"""

from __future__ import annotations

from prompt import TRAP_TEXT, call_text


class Plan:
    def __init__(self, chains: list[list[str]], mode: str, estimate_ms):
        self.chains = [list(chain) for chain in chains if chain]
        self.mode, self.estimate_ms = mode, estimate_ms
        self.next_step = [0] * len(self.chains)  # index of the next call to write, per chain
        self.written: dict[str, int] = {}        # call id -> chain, for calls written but not answered
        self._ids = 0

    def answered(self, call_id: str) -> None:
        """The result of ``call_id`` is in the context: its chain may go on."""
        self.written.pop(call_id, None)

    def done(self) -> bool:
        return not self.written and all(s == len(c) for s, c in zip(self.next_step, self.chains))

    def next_text(self) -> str | None:
        """The CML text to force now, or None when the plan is complete."""
        ready = [i for i, chain in enumerate(self.chains)
                 if self.next_step[i] < len(chain) and i not in self.written.values()]
        if self.mode == "sync-parallel":
            return self._next_in_round(ready)
        if ready:
            if self.mode != "sync":
                ready.sort(key=lambda i: -self.estimate_ms(self.chains[i][self.next_step[i]]))  # LPT
            return self._write(ready[0])
        return TRAP_TEXT if self.written else None

    def _next_in_round(self, ready: list[int]) -> str | None:
        if self.written:  # the round is written: wait for all of it
            return TRAP_TEXT
        return "".join(self._write(i) for i in ready) or None

    def _write(self, chain: int) -> str:
        self._ids += 1
        call_id = f"t{self._ids}"
        call = self.chains[chain][self.next_step[chain]]
        self.next_step[chain] += 1
        self.written[call_id] = chain
        return call_text(call_id, call)

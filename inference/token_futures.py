"""One connection's token future slots: what a sampling item drew, for later items to take as input.

The sender chooses the slot ids (it names a slot in the next step before this step's reply comes
back), so the table is per connection: two control processes never see each other's slots.
"""

from __future__ import annotations

from oven.proto import inference as p

from .decoders import Decoders
from .sampling import make_sampler, sample_dist
from .validate import ItemFailure

MAX_SLOTS = 1 << 16  # a peer that never frees cannot grow this process without bound


def _no_grammars():
    raise ItemFailure(p.ERR_BAD_ARGUMENT, "grammars are not available to this caller")


class TokenFutures:
    """Slot id -> the sampled token, or the ItemError that failed the item that was to sample it; and the
    connection's decoders, which its sampling items advance (``llg_tokenizer``: see Decoders)."""

    def __init__(self, llg_tokenizer=_no_grammars, max_slots: int = MAX_SLOTS):
        self.max_slots = max_slots
        self._slots: dict[int, int | p.ItemError] = {}
        self.decoders = Decoders(llg_tokenizer)

    def __len__(self) -> int:
        return len(self._slots)

    def check_writable(self, future_id: int) -> None:
        """ItemFailure (bad_future) when a new slot would exceed ``max_slots``."""
        if future_id not in self._slots and len(self._slots) >= self.max_slots:
            raise ItemFailure(p.ERR_BAD_FUTURE, f"token future {future_id}: this connection already holds "
                                                f"{self.max_slots} token futures (free some)")

    def token(self, future_id: int) -> int:
        """The token slot ``future_id`` holds; ItemFailure (bad_future) for a free or failed slot."""
        value = self._slots.get(future_id)
        if value is None:
            raise ItemFailure(p.ERR_BAD_FUTURE, f"token future {future_id} is free (never sampled, or freed)")
        if isinstance(value, p.ItemError):
            raise ItemFailure(p.ERR_BAD_FUTURE, f"token future {future_id} failed: {value.message}")
        return value

    def fill(self, future_id: int, token: int) -> None:
        self._slots[future_id] = token

    def fail(self, future_id: int, error: p.ItemError) -> None:
        if future_id in self._slots or len(self._slots) < self.max_slots:
            self._slots[future_id] = error

    def free(self, future_ids: list[int]) -> None:
        for future_id in future_ids:
            self._slots.pop(future_id, None)


def resolve_tokens(item: p.ForwardTextItem, futures: TokenFutures, sampled_here: set[int]) -> list[int]:
    """``item.token_ids`` with every slot ``item.token_futures`` names replaced by its token;
    ItemFailure (bad_future) for a slot that is free or failed, or that an item of the same request
    samples (its token does not exist before this batch has run)."""
    if item.token_futures is None:
        return item.token_ids
    if len(item.token_futures) != len(item.token_ids):
        raise ItemFailure(p.ERR_BAD_ARGUMENT, f"token_futures has {len(item.token_futures)} entries for "
                                              f"{len(item.token_ids)} tokens")
    tokens = list(item.token_ids)
    for i, future_id in enumerate(item.token_futures):
        if future_id == -1:
            continue
        if future_id in sampled_here:
            raise ItemFailure(p.ERR_BAD_FUTURE, f"token future {future_id} is sampled by an item of the same "
                                                "request: send its reader in a later one")
        tokens[i] = futures.token(future_id)
    return tokens


def check_sample(item: p.ForwardTextItem, futures: TokenFutures):
    """The SDK sampler ``item.sample`` asks for (None without one); ItemFailure for a bad spec, an item
    with no output to sample at, or a full table."""
    if item.sample is None:
        return None
    if not item.output_indices:
        raise ItemFailure(p.ERR_BAD_ARGUMENT, "sample needs an output index to sample at")
    futures.check_writable(item.sample.future_id)
    return make_sampler(item.sample)


def settle_samples(items: list[p.ForwardTextItem], errors: list[p.ItemError | None], samplers: dict[int, object],
                   dists: list[list[p.TopKDist] | None], futures: TokenFutures) -> list[int | None]:
    """Draw each sampling item's token from the distribution of its last output index (the step's
    next token) into its slot, or fail the slot with the item's error; the tokens, per item (empty
    when no item samples)."""
    if all(item.sample is None for item in items):
        return []
    sampled: list[int | None] = [None] * len(items)
    for i, item in enumerate(items):
        if item.sample is None:
            continue
        if errors[i] is not None:
            futures.fail(item.sample.future_id, errors[i])
        else:
            sampled[i] = sample_dist(samplers[i], dists[i][-1])
            futures.fill(item.sample.future_id, sampled[i])
    return sampled


def fail_samples(items: list[p.ForwardTextItem], futures: TokenFutures, error: p.ItemError) -> None:
    """A batch that crashed: each sampling item's slot fails with the error its item gets."""
    for item in items:
        if item.sample is not None:
            futures.fail(item.sample.future_id, error)

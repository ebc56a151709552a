"""Which inference replica an instance lives on, and KV exports across replicas.

A new instance goes to the least loaded replica that serves (fewest KvPages in use, then fewest
instances; ties in turn), as Pie binds a context to its least loaded driver. The choice is
final at the instance's first call that reaches its replica (``Instance.placed``: an allocation
or a queued call); until then an import of an export held by another replica moves the instance
there, so an inferlet that starts from a shared prefix runs where the prefix is.

Export names stay per client across replicas (one name, one export). An import from another replica
by an instance already placed fails with :data:`ELSEWHERE` in its message: the pages live in another
process's memory and are not copied; the SDKs then recompute the tokens (``Context.imported``).
Snapshots (exports that record their tokens) are the same: one name per client across replicas, the
client's caps counted over every replica, and a match looks where the instance's K/V is (every
replica for one not placed yet, which an open then moves to the snapshot's).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

from oven.control.resources.slab import ResourceError
from oven.control.resources.table import ResourceTable

from .calls import scheduler_key
from .instance import Instance, InstanceLimits
from .replica import Replica

# The words an import's error carries when the export is held by another replica (the SDKs look for them).
ELSEWHERE = "held by another inference replica"


class Placement:
    def __init__(self, replicas: Sequence[Replica], limits: InstanceLimits):
        self.replicas, self._limits = replicas, limits
        self._turns = itertools.count()

    def place(self, inst: Instance) -> None:
        """Put a new instance on the least loaded serving replica (any, if none serves yet)."""
        serving = [r for r in self.replicas if r.serving] or list(self.replicas)
        least = min(r.load for r in serving)
        tied = [r for r in serving if r.load == least]
        self._bind(inst, tied[next(self._turns) % len(tied)])

    def _bind(self, inst: Instance, replica: Replica) -> None:
        inst.replica, inst.host = replica, replica.host
        inst.resources = ResourceTable(inst.instance_id, replica.kv_pool, replica.embed_pool, replica.host_pool,
                                       max_kvpages=self._limits.max_kv_pages, max_embeds=self._limits.max_embeds)
        replica.instances[inst.instance_id] = inst

    def move(self, inst: Instance, to: Replica) -> None:
        """Move an instance that is not placed yet (nothing of it is in its replica) to ``to``."""
        old = inst.replica
        del old.instances[inst.instance_id]
        queues = [(state, old.scheduler.queue(state.scheduler_queue_id).priority) for state in inst.queues.values()]
        for state, priority in queues:
            old.scheduler.remove_queue(state.scheduler_queue_id)  # empty: nothing was queued
            state.scheduler_queue_id = to.scheduler.create_queue(scheduler_key(inst.instance_id), priority)
        self._bind(inst, to)

    def holder(self, name: str, namespace: str) -> Replica | None:
        return next((r for r in self.replicas if (namespace, name) in r.exports), None)

    def export(self, inst: Instance, handles: list[int], name: str) -> None:
        """``export-kvpages``: the name must be free on every replica."""
        if isinstance(name, str) and self.holder(name, inst.owner) is not None:
            raise ResourceError(f"export name {name!r} is taken")
        inst.replica.exports.export_kvpages(inst.resources, name, handles, inst.owner)

    def save_snapshot(self, inst: Instance, handles: list[int], tokens: list[int], name: str) -> None:
        """``save-snapshot``: the name must be free on every replica; the caps count every replica's."""
        if isinstance(name, str) and self.holder(name, inst.owner) is not None:
            raise ResourceError(f"export name {name!r} is taken")
        others = [r.exports.snapshot_usage(inst.owner) for r in self.replicas if r is not inst.replica]
        elsewhere = (sum(count for count, _ in others), sum(pages for _, pages in others))
        inst.replica.exports.save_snapshot(inst.resources, name, handles, tokens, inst.owner, elsewhere)

    def _snapshot(self, inst: Instance, name: str):
        """Client ``inst.owner``'s snapshot ``name``, on whichever replica holds it (else ResourceError)."""
        holder = self.holder(name, inst.owner) if isinstance(name, str) else None
        return (holder or inst.replica).exports.snapshot(name, inst.owner)

    def snapshot_tokens(self, inst: Instance, name: str) -> list[int]:
        """``snapshot-tokens``: the token ids client ``inst.owner``'s snapshot ``name`` holds."""
        return list(self._snapshot(inst, name).tokens)

    def open_snapshot(self, inst: Instance, name: str) -> list[int]:
        """``open-snapshot``: an import that only a snapshot answers."""
        self._snapshot(inst, name)  # ResourceError unless the client has a snapshot by that name
        return self.import_(inst, name)

    def match_snapshot(self, inst: Instance, tokens: list[int]) -> str:
        """``match-snapshot``: the name of the client's snapshot sharing the longest prefix with ``tokens``
        where the instance's K/V is (anywhere, for one not placed yet), or ""."""
        replicas = [inst.replica] if inst.placed else self.replicas
        best_name, best_len = "", 0
        for replica in replicas:
            name, length = replica.exports.match_snapshot(tokens, inst.owner)
            if length > best_len:
                best_name, best_len = name, length
        return best_name

    def import_(self, inst: Instance, name: str) -> list[int]:
        """``import-kvpages``: from the instance's replica, moving an instance not placed yet to the
        export's; ResourceError with :data:`ELSEWHERE` for an export out of reach."""
        holder = self.holder(name, inst.owner) if isinstance(name, str) else None
        if holder is not None and holder is not inst.replica:
            if inst.placed:
                raise ResourceError(f"export {name!r} is {ELSEWHERE} ({holder.index}; this instance's K/V is "
                                    f"on {inst.replica.index}): recompute its tokens")
            self.move(inst, holder)
        inst.placed = True
        return inst.replica.exports.import_kvpages(inst.resources, name, inst.owner)

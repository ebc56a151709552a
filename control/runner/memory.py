"""What a runner's instances hold of their client's memory share (``oven serve --client-memory-mib``).

Linear memories are wasmtime's default ones: each reserves 4 GiB and guard pages of address space and
is writable only as far as it has grown. The control process caps the runner's ``RLIMIT_DATA``
(``control/runtime/runners.py``), which counts private writable memory: what memories grow into, not
what they reserve. That limit is a backstop only, since the runner's own heap (Python, wasmtime) shares
it and an allocation of its own failing there can leave the runner hung. So the runner keeps its
instances to their share itself, after every launch and slice (``Runner._keep_share``), and the kernel's
limit lies above the share by what one slice may add and a reserve for the runner's heap.
"""

from __future__ import annotations

import functools
import os
import resource

SHARE_REACHED = ("out of memory, this client's instances together reached their share "
                 "(oven serve --client-memory-mib)")
PAGE_BYTES = os.sysconf("SC_PAGESIZE")


@functools.cache
def _statm() -> int:
    return os.open("/proc/self/statm", os.O_RDONLY)  # kept open: a read is 2 µs, an open 40 µs more


def data_bytes() -> int:
    """This process's private writable memory, which RLIMIT_DATA counts (statm's data, with the stack)."""
    return int(os.pread(_statm(), 128, 0).split()[5]) * PAGE_BYTES


def data_left() -> int:
    """Bytes this process may still make private and writable under its RLIMIT_DATA (a lot without one)."""
    limit = resource.getrlimit(resource.RLIMIT_DATA)[0]
    return 1 << 62 if limit == resource.RLIM_INFINITY else limit - data_bytes()

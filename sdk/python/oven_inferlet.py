"""Drives a Python inferlet written as a generator on the host's ``start``/``resume`` exports.

An inferlet's ``main()`` yields the futures it waits on and receives the ones
that completed (the host resumes on any of them). ``WitWorld = world(main)``
in the inferlet's ``app.py`` is all the glue componentize-py needs.
"""

import wit_world
from host_boundary import check_imports

check_imports()  # a wrongly typed argument to a host function raises TypeError instead of trapping


def wait_all(pending):
    """Wait, inside ``main``, until every future in ``pending`` has completed."""
    pending = set(pending)
    while pending:
        ready = yield sorted(pending)
        pending -= set(ready)


def world(main):
    """A ``WitWorld`` class whose ``start`` runs ``main()`` up to its first wait and ``resume`` continues it."""

    class Driver(wit_world.WitWorld):
        program = None

        def start(self):
            Driver.program = main()
            return next(Driver.program, [])  # a main that never yields is done at once

        def resume(self, ready):
            try:
                return Driver.program.send(ready)
            except StopIteration:
                return []

    return Driver

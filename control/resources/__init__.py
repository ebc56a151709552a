"""Resource bookkeeping of the control layer: pure Python, no torch, no I/O.

The inference layer addresses KvPages, Embeds and host-tier slots by physical
id and decides nothing. Here live the pools of those ids (:class:`PhysicalPool`),
each inferlet instance's virtual handles (:class:`ResourceTable`), shared KV
between instances (:class:`ExportRegistry`: exports and named snapshots), and the policy for an exhausted
pool (:func:`choose_victims`).

The package imports none of its modules: the CLI reads a policy's names from here without loading
the rest, so code imports from the module that defines a name.
"""

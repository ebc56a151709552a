"""The control layer's batch scheduler: command queues, batch formation and dispatch policies.

Pure and I/O-free: the runtime submits :class:`Command` objects, asks a
:class:`DispatchPolicy` whether to dispatch (passing its clock as ``now``) and
sends what :meth:`BatchScheduler.form_batch` returns to the inference layer.

The package imports none of its modules: the CLI reads a policy's names from here without loading
the rest, so code imports from the module that defines a name.
"""

"""The inferlet's own prompt and CML modules (``inferlets/asynclm/prompt.py`` and ``cml.py``), loaded
from their files: training text and serving text come from one source.

Both modules are standard-library Python (they run inside the inferlet's CPython in WebAssembly),
so the client imports them as they are, from the library's inferlet sources (:mod:`oven.client.paths`).
"""

from __future__ import annotations

import importlib.util
import sys
import threading
from functools import cache
from types import ModuleType

from ...paths import inferlets_dir

_loading = threading.Lock()


def _load(name: str) -> ModuleType:
    # Once per process, even when the check's threads ask at the same time: a second copy of a
    # module would have classes of its own, and isinstance against the other copy's would fail.
    with _loading:
        return _load_once(name)


@cache
def _load_once(name: str) -> ModuleType:
    path = inferlets_dir() / "asynclm" / f"{name}.py"
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing: the AsyncLM inferlet's sources are part of oven (reinstall it, "
                                "or point OVEN_INFERLETS_DIR at an inferlets/ folder)")
    spec = importlib.util.spec_from_file_location(f"oven_asynclm_inferlet_{name}", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the class is built
    spec.loader.exec_module(module)
    return module


def prompt() -> ModuleType:
    """``inferlets/asynclm/prompt.py``: ``system_prompt``, ``RULES``, ``PLAIN_RULES``, ``call_text``,
    ``interrupt_text``, ``TRAP_TEXT``."""
    return _load("prompt")


def cml() -> ModuleType:
    """``inferlets/asynclm/cml.py``: the ``TokenMonitor`` that decides where interrupts may go."""
    return _load("cml")

"""Where the client finds what ships with oven: the WIT world, the SDKs and the library's inferlets.

They are package data (``oven.proto`` holds ``wit/``, ``oven.sdk`` the SDKs, ``oven.inferlets`` the
inferlets' sources), so an installed package finds them in site-packages and a checkout (an
editable install) in the repository; never through a repository root guessed from ``__file__``.
``OVEN_SDK_DIR``, ``OVEN_WIT_DIR`` and ``OVEN_INFERLETS_DIR`` point elsewhere (say, a checkout of
a newer SDK).
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path


def _package_dir(package: str) -> Path:
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(f"package data {package} is missing: reinstall oven")
    return Path(next(iter(spec.submodule_search_locations)))


def _setting(env: str, package: str, *below: str) -> Path:
    explicit = os.environ.get(env)
    return Path(explicit) if explicit else _package_dir(package).joinpath(*below)


def wit_dir() -> Path:
    """The WIT world inferlets are built against (``proto/wit``)."""
    return _setting("OVEN_WIT_DIR", "oven.proto", "wit")


def sdk_dir() -> Path:
    """The SDKs: ``python/`` (the module path of Python inferlets) and ``rust/`` (the crates)."""
    return _setting("OVEN_SDK_DIR", "oven.sdk")


def inferlets_dir() -> Path:
    """The library's inferlets, one folder each (``oven run NAME`` runs ``NAME/NAME.wasm``)."""
    return _setting("OVEN_INFERLETS_DIR", "oven.inferlets")


def templates_dir() -> Path:
    """``oven new``'s templates (part of this package)."""
    return Path(__file__).resolve().parent / "templates"

"""The adapter store: the LoRA adapters a server loads at start, one folder per name.

``$OVEN_CACHE_DIR/adapters/<name>/`` holds a copy of a PEFT LoRA folder, only
its ``adapter_config.json`` and ``adapter_model.safetensors`` (nothing else is
copied: no pickle, no code). A name is validated like a program name and is
never a path. Adapters that ship with oven as package data (:data:`PACKAGED`,
the AsyncLM adapter) are offered beside the stored ones by a server whose model
they were trained for (``base_model_name_or_path`` in their config): a newer one
in the package is used at the next start, and no copy of it goes stale in a
cache; their names are reserved. The store only files adapters; whether one fits the served model
is for the inference process to say when it loads it (``oven serve`` loads every
stored adapter at start; ``oven adapters add`` with a server running loads it
first and keeps it only if that succeeds). Without a server the CLI edits the
store directly, checking no more than the files' presence, size and JSON shape.
A store, or a stored adapter, that another local user could have written is not
used (:func:`oven.proto.auth.check_path`).
"""

from __future__ import annotations

import importlib.util
import logging
import os
import re
import shutil
import tempfile
from pathlib import Path

from oven.proto.auth import UnsafePath, check_path, default_cache_dir, private_dir
from oven.proto.peft_folder import CONFIG_FILE, WEIGHTS_FILE, AdapterFolderError, read_config

FILES = (CONFIG_FILE, WEIGHTS_FILE)
ADAPTER_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
MAX_WEIGHTS_BYTES = 1 << 30  # the inference process has its own, smaller limit (max_adapter_bytes)
# name -> (package, folder in it): the adapters that ship with oven.
PACKAGED = {"asynclm": ("oven.client.asynclm", "adapter")}

log = logging.getLogger(__name__)


class AdapterStoreError(ValueError):
    """A refused name or folder; the message is one line."""


def default_adapter_dir() -> Path:
    return default_cache_dir() / "adapters"


def check_name(name: str) -> None:
    if not isinstance(name, str) or not ADAPTER_NAME.match(name):
        raise AdapterStoreError(f"an adapter name is 1-64 of A-Z a-z 0-9 . _ - (not starting with . _ -); "
                                f"not {name!r}")


def check_folder(folder: Path) -> None:
    """What can be checked without the model: both files present, sizes, a JSON object naming LoRA."""
    try:
        config = read_config(folder)
    except AdapterFolderError as exc:
        raise AdapterStoreError(str(exc)) from None
    weights = folder / WEIGHTS_FILE
    if not weights.is_file():
        raise AdapterStoreError(f"{folder}: no {WEIGHTS_FILE} (expected a PEFT LoRA folder)")
    if weights.stat().st_size > MAX_WEIGHTS_BYTES:
        raise AdapterStoreError(f"{folder}: {WEIGHTS_FILE} is over {MAX_WEIGHTS_BYTES >> 20} MiB")
    if config.get("peft_type") != "LORA":
        raise AdapterStoreError(f"{folder}: {CONFIG_FILE} does not describe a LoRA adapter (peft_type LORA)")


def packaged_adapters(model_name: str) -> dict[str, Path]:
    """The packaged adapters trained for ``model_name``, by name (missing package data is skipped)."""
    found = {}
    for name, (package, folder) in PACKAGED.items():
        spec = importlib.util.find_spec(package)
        if spec is None or not spec.submodule_search_locations:
            continue
        path = Path(next(iter(spec.submodule_search_locations))) / folder
        try:
            base = read_config(path).get("base_model_name_or_path")
        except (OSError, AdapterFolderError):
            continue
        if base == model_name:
            found[name] = path
    return found


class AdapterStore:
    """Adapter folders under ``root`` (created 0700), by name."""

    def __init__(self, root: Path | None = None):
        self.root = Path(root) if root is not None else default_adapter_dir()

    def names(self) -> list[str]:
        """Stored adapters, sorted; half-written entries (see :meth:`add`), stray files and adapters another
        user could have written (logged) are not names. UnsafePath for a store another user could write."""
        if not check_path(self.root, "adapter_dir").is_dir():
            return []
        return sorted(p.name for p in self.root.iterdir()
                      if ADAPTER_NAME.match(p.name) and p.is_dir() and all((p / f).is_file() for f in FILES)
                      and _trusted(p))

    def path(self, name: str) -> Path:
        check_name(name)
        return self.root / name

    def has(self, name: str) -> bool:
        return name in self.names()

    def add(self, name: str, folder: Path) -> Path:
        """Copy ``folder``'s two adapter files into the store as ``name``; its path in the store.

        Written to a temporary folder first and renamed into place, so a name is
        either absent or complete. AdapterStoreError for a bad name, a taken one or a bad folder.
        """
        check_name(name)
        if name in PACKAGED:
            raise AdapterStoreError(f"{name!r} is the name of an adapter that ships with oven; choose another")
        folder = Path(folder).expanduser()
        check_folder(folder)
        root = private_dir(self.root, "adapter_dir")
        target = root / name
        if target.exists():
            raise AdapterStoreError(f"an adapter named {name!r} exists; remove it first (oven adapters remove {name})")
        staging = Path(tempfile.mkdtemp(prefix=".adding-", dir=root))
        try:
            for file in FILES:
                shutil.copyfile(folder / file, staging / file)
            os.rename(staging, target)
        except OSError as exc:
            shutil.rmtree(staging, ignore_errors=True)
            raise AdapterStoreError(f"{folder}: cannot copy it into {root} ({exc.strerror or exc})") from None
        return target

    def remove(self, name: str) -> None:
        """AdapterStoreError for a bad or unknown name."""
        path = self.path(name)
        if not path.is_dir():
            raise AdapterStoreError(f"no adapter named {name!r}")
        shutil.rmtree(path)


def _trusted(folder: Path) -> bool:
    try:
        check_path(folder, "adapter_dir", entries=True)
        return True
    except UnsafePath as exc:
        log.warning("ignoring the stored adapter %s: %s", folder.name, exc)
        return False

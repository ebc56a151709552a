#!/usr/bin/env bash
# The first GPU run in one command: install what the GPU machine lacks, run every gpu-marked test,
# bench/gpu_decode.py and, where there are two GPUs, bench/tensor_parallel.py over NCCL (else
# bench/data_parallel.py's two replicas on the one GPU), and write one
# report (bench/results/gpu_check.md, or $OVEN_GPU_REPORT).
#
#   bash bench/gpu_check.sh --download [DIR]   # on a machine that reaches PyPI, with oven set up (.venv):
#                                              # wheels for the GPU machine + the tokenizer donor folder
#   bash bench/gpu_check.sh [DIR]              # on the GPU machine: install from DIR, else from PyPI; run; report
#
# DIR defaults to .whl (git-ignored here). The GPU machines this project is lent have torch (CUDA), nvcc,
# transformers, tokenizers, safetensors, msgpack, pytest and peft, but no flashinfer-python, apache-tvm-ffi
# or pyzmq, and reach no registry; and the embedded model's wheel (94 MB) is too big to carry, so random-
# weight models take their tokenizer from a small exported folder ($OVEN_TOKENIZER_DONOR).
# Environment: PYTHON (python3), GPU_PYTHON_VERSION (3.12, for --download), OVEN_GPU_SITE (/tmp/oven-gpu-site),
# OVEN_GPU_LOGS (each step's full log and a profile of batch-1 decode steps; a temporary folder).
set -uo pipefail
cd "$(dirname "$0")/.."

FLASHINFER_VERSION=0.7.2.post1
PACKAGES=("flashinfer-python==${FLASHINFER_VERSION}" "apache-tvm-ffi>=0.1.11,<0.2" "pyzmq>=25")
PY=${PYTHON:-python3}
say() { echo "gpu_check: $*" >&2; }

download() {
    local dir=$1 pyver=${GPU_PYTHON_VERSION:-3.12}
    local platforms=() n transformers
    for n in 17 24 27 28 31 34; do platforms+=(--platform "manylinux_2_${n}_x86_64"); done
    # transformers too, as set up here: the GPU machine's may be older than pyproject.toml asks for.
    transformers=$("$PY" -c "import transformers; print(transformers.__version__)") || return 1
    mkdir -p "$dir"
    say "downloading ${PACKAGES[*]} transformers==$transformers for CPython ${pyver} on x86-64 into $dir"
    "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version "$pyver" --implementation cp \
        "${platforms[@]}" --platform manylinux2014_x86_64 -d "$dir" "${PACKAGES[@]}" \
        "transformers==$transformers" || return 1
    # The flashinfer-python wheel (62 MB) would not fit the 64 MiB that may travel to a lent GPU machine
    # with the repository: drop the kernel sources oven never JIT-builds (MoE, the model-specific "cake"
    # kernels, Blackwell-only ones). Their Python modules stay, so `import flashinfer` is unchanged.
    "$PY" - "$dir"/flashinfer_python-*.whl <<'PYEOF' || return 1
import re, sys, zipfile
from pathlib import Path
DROP = re.compile(r"flashinfer/(data/csrc/(cake_[^/]*|kda|gdn|fused_moe|experimental|blackwell_[^/]*)/"
                  r"|moe_ep/kernel_src/)")
src = Path(sys.argv[1])
slim = src.with_suffix(".slim")
with zipfile.ZipFile(src) as zin, zipfile.ZipFile(slim, "w", zipfile.ZIP_DEFLATED) as zout:
    for info in zin.infolist():
        if DROP.match(info.filename):
            continue
        data = zin.read(info)
        if info.filename.endswith(".dist-info/RECORD"):  # pip installs what RECORD lists
            data = b"".join(line for line in data.splitlines(True) if not DROP.match(line.decode()))
        zout.writestr(info, data)
slim.replace(src)
PYEOF
    say "exporting the tokenizer donor (config and tokenizer files, no weights) into $dir/tokenizer-donor"
    "$PY" -c "import sys; from pathlib import Path; from oven.inference.models import export_tokenizer_donor; \
export_tokenizer_donor(Path(sys.argv[1]))" "$dir/tokenizer-donor" || return 1
    du -sh "$dir" >&2
}

if [ "${1:-}" = "--download" ]; then
    PY=${PYTHON:-.venv/bin/python}
    download "${2:-.whl}"
    exit $?
fi

WHEELS=${1:-.whl}
SITE=${OVEN_GPU_SITE:-/tmp/oven-gpu-site}
REPORT=${OVEN_GPU_REPORT:-bench/results/gpu_check.md}
LOGS=${OVEN_GPU_LOGS:-$(mktemp -d)}
mkdir -p "$LOGS"
PIP=("$PY" -m pip install -q --disable-pip-version-check --no-compile --target "$SITE" --upgrade)

if ! "$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
    say "torch sees no CUDA device here: nothing to check (run it on a GPU machine)"
    exit 1
fi

# 1. Install: wheels brought along, else the registry; then oven itself (its dependencies: the machine's own).
mkdir -p "$SITE"
if compgen -G "$WHEELS/*.whl" >/dev/null; then
    say "installing the wheels in $WHEELS"
    "${PIP[@]}" --no-index --no-deps "$WHEELS"/*.whl || exit 1
elif ! "$PY" -c "import flashinfer, zmq" 2>/dev/null; then
    say "no wheels in $WHEELS: trying the registry for ${PACKAGES[*]}"
    "${PIP[@]}" "${PACKAGES[@]}" || say "could not install them: FlashInfer tests will skip"
fi
# oven itself is linked from this checkout, package by package as pyproject.toml maps them: no build
# step, so nothing depends on the machine's setuptools (the SPDX license field needs 77 or later).
mkdir -p "$SITE/oven"
"$PY" - "$SITE/oven" <<'PYEOF' || exit 1
import sys, tomllib
from pathlib import Path
dirs = tomllib.loads(Path("pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
for package, folder in dirs.items():
    link = Path(sys.argv[1], package.removeprefix("oven."))
    link.unlink(missing_ok=True)
    link.symlink_to(Path(folder).resolve(), target_is_directory=True)
PYEOF
export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"
if [ -f "$WHEELS/tokenizer-donor/config.json" ]; then
    export OVEN_TOKENIZER_DONOR="$PWD/$WHEELS/tokenizer-donor"
fi

# 2. The machine, the versions, and whether FlashInfer can build its kernels (first use compiles with nvcc).
{
    nvidia-smi -L 2>/dev/null || true
    "$PY" - <<'EOF'
import importlib.metadata as md, torch
from oven.inference.attention.toolchain import probe_toolchain
print(f"torch {torch.__version__} (CUDA {torch.version.cuda}), GPU {torch.cuda.get_device_name(0)}, "
      f"capability {torch.cuda.get_device_capability(0)}")
for name in ("flashinfer-python", "apache-tvm-ffi", "pyzmq", "transformers"):
    try:
        print(f"{name} {md.version(name)}")
    except md.PackageNotFoundError:
        print(f"{name}: not installed")
chain = probe_toolchain()
print(f"FlashInfer toolchain: {chain}; usable: {chain.problem() or 'yes'}")
EOF
} >"$LOGS/machine.txt" 2>&1
cat "$LOGS/machine.txt" >&2

# 3. FlashInfer's kernels, all in one parallel build (else each is JIT-compiled at its first use, in
#    series, into ~/.cache/flashinfer); then every gpu-marked test, then the benchmark. Only the test
#    files that hold gpu tests are collected: the others import the control layer (wasmtime), which
#    the GPU machine lacks.
if "$PY" -c "import flashinfer"; then
    say "building FlashInfer's kernels"
    PYTHONUNBUFFERED=1 "$PY" bench/flashinfer_prebuild.py 2>&1 | tee "$LOGS/prebuild.txt"
fi
say "running the gpu-marked tests"
mapfile -t gpu_tests < <(grep -l "mark\.gpu" tests/test_*.py)
"$PY" -m pytest -m gpu -v -rA -p no:cacheprovider -o faulthandler_timeout=300 "${gpu_tests[@]}" 2>&1 | tee "$LOGS/tests.txt"
tests_rc=${PIPESTATUS[0]}
say "running bench/gpu_decode.py"
PYTHONUNBUFFERED=1 "$PY" bench/gpu_decode.py --profile "$LOGS/profile.txt" 2>&1 | tee "$LOGS/bench.txt"
bench_rc=${PIPESTATUS[0]}
# Tensor parallelism over NCCL needs a device per rank: its equality test is among the gpu-marked ones.
tp_rc=0
if [ "$("$PY" -c "import torch; print(torch.cuda.device_count())")" -ge 2 ]; then
    say "running bench/tensor_parallel.py on two GPUs"
    PYTHONUNBUFFERED=1 "$PY" bench/tensor_parallel.py --device cuda --dtype bfloat16 --model dummy:llama-3.2-1b \
        2>&1 | tee "$LOGS/tensor_parallel.txt"
    tp_rc=${PIPESTATUS[0]}
else  # one GPU: what a second data-parallel replica on the same device gains (no wasm needed)
    say "running bench/data_parallel.py --parts c on one GPU"
    PYTHONUNBUFFERED=1 "$PY" bench/data_parallel.py --parts c --device cuda --dtype bfloat16 \
        --model dummy:llama-3.2-1b --batch 64 --rounds 2 --seconds 5 2>&1 | tee "$LOGS/data_parallel.txt"
    tp_rc=${PIPESTATUS[0]}
fi

# 4. One report.
mkdir -p "$(dirname "$REPORT")"
{
    echo "# GPU check"
    echo
    echo "$(date -u '+%Y-%m-%d %H:%M UTC'), commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
    echo
    echo '## Machine and toolchain'
    echo; echo '```'; cat "$LOGS/machine.txt"; echo '```'; echo
    if [ -f "$LOGS/prebuild.txt" ]; then
        echo "## FlashInfer kernels (bench/flashinfer_prebuild.py)"
        echo; echo '```'; tail -5 "$LOGS/prebuild.txt"; echo '```'; echo
    fi
    echo "## gpu-marked tests (exit $tests_rc)"
    echo; echo '```'; grep -E "^(PASSED|FAILED|ERROR|SKIPPED)|passed|failed|error" "$LOGS/tests.txt" | tail -60; echo '```'; echo
    echo "## bench/gpu_decode.py (exit $bench_rc)"
    echo; echo '```'; grep -v -E "^[0-9-]+ [0-9:,]+ " "$LOGS/bench.txt" | tail -40; echo '```'
    if [ -f "$LOGS/data_parallel.txt" ]; then
        echo; echo "## bench/data_parallel.py --parts c, two replicas on one GPU (exit $tp_rc)"
        echo; echo '```'; grep -v -E "^[0-9-]+ [0-9:,]+ " "$LOGS/data_parallel.txt" | tail -12; echo '```'
    fi
    if [ -f "$LOGS/tensor_parallel.txt" ]; then
        echo; echo "## bench/tensor_parallel.py, two GPUs over NCCL (exit $tp_rc)"
        echo; echo '```'; grep -v -E "^[0-9-]+ [0-9:,]+ " "$LOGS/tensor_parallel.txt" | tail -20; echo '```'
    fi
} >"$REPORT"
say "wrote $REPORT"
[ "$tests_rc" -eq 0 ] && [ "$bench_rc" -eq 0 ] && [ "$tp_rc" -eq 0 ]

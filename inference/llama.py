"""A Llama-family decoder that reads and writes a paged KV cache.

Parameter names match transformers' ``LlamaForCausalLM``, so a state dict moves
between the two unchanged (the tests rely on this). Attention is delegated to
an :class:`~oven.inference.attention.base.AttentionBackend` that has already
been planned for the batch: this module only does the dense math.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Callable

import torch
from torch import nn
from torch.overrides import TorchFunctionMode

from .adapters import DOWN, GATE_UP, O, QKV
from .attention.base import AttentionBackend
from .config import ModelConfig
from .lora import LoraExecutor
from .rope import rope_frequencies
from .sharding import Shard

log = logging.getLogger(__name__)


class PackedLinear(nn.Module):
    """A CPU linear layer over weights pre-packed by oneDNN (what torch.compile's CPU freezing does).

    torch's plain CPU GEMM is fast for one row (GEMV) but slow for 2-16 rows; a
    packed weight makes a decode step for 8 sequences cost about what one costs.
    The original ``weight`` stays a parameter, so state dicts are unchanged.
    """

    def __init__(self, linear: nn.Linear):
        super().__init__()
        self.weight = linear.weight
        self.packed = torch.ops.mkldnn._reorder_linear_weight(linear.weight.detach(), None)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.mkldnn._linear_pointwise(x, self.packed, None, "none", [], "")


def pack_for_cpu(model: nn.Module) -> None:
    """Swap every bias-free nn.Linear of a CPU model for a :class:`PackedLinear`."""
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, nn.Linear) and child.bias is None:
                setattr(parent, name, PackedLinear(child))


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps
        self.kernel = None  # a fused (x, weight, eps) -> x kernel; see PagedLlama.use_flashinfer_kernels

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.kernel is not None:
            return self.kernel(x, self.weight, self.eps)
        # Normalise in float32 like transformers, so bf16 results match it too.
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.num_q_heads, self.num_kv_heads, self.head_dim = cfg.num_q_heads, cfg.num_kv_heads, cfg.head_dim
        self.q_proj = nn.Linear(cfg.hidden_size, cfg.num_q_heads * cfg.head_dim, bias=False)
        self.k_proj = nn.Linear(cfg.hidden_size, cfg.num_kv_heads * cfg.head_dim, bias=False)
        self.v_proj = nn.Linear(cfg.hidden_size, cfg.num_kv_heads * cfg.head_dim, bias=False)
        self.o_proj = nn.Linear(cfg.num_q_heads * cfg.head_dim, cfg.hidden_size, bias=False)

    def forward(self, x, rotary: "Rotary", backend: AttentionBackend, layer_idx: int,
                lora: LoraExecutor | None = None) -> torch.Tensor:
        n = x.shape[0]
        q, k, v = self.q_proj(x), self.k_proj(x), self.v_proj(x)
        if lora is not None:
            lora.apply(layer_idx, QKV, x, (q, k, v))
        q, k = rotary(q.view(n, self.num_q_heads, self.head_dim), k.view(n, self.num_kv_heads, self.head_dim))
        out = backend.run(layer_idx, q, k, v.view(n, self.num_kv_heads, self.head_dim))
        out = out.reshape(n, self.num_q_heads * self.head_dim)
        o = self.o_proj(out)
        if lora is not None:
            lora.apply(layer_idx, O, out, (o,))
        return o


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.gate_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.up_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def forward(self, x: torch.Tensor, layer_idx: int, lora: LoraExecutor | None = None) -> torch.Tensor:
        if lora is None:
            return self.down_proj(nn.functional.silu(self.gate_proj(x)) * self.up_proj(x))
        gate, up = self.gate_proj(x), self.up_proj(x)
        lora.apply(layer_idx, GATE_UP, x, (gate, up))
        h = nn.functional.silu(gate) * up
        down = self.down_proj(h)
        lora.apply(layer_idx, DOWN, h, (down,))
        return down


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.self_attn = Attention(cfg)
        self.mlp = MLP(cfg)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        # Under tensor parallelism the attention and MLP outputs are one rank's partial sums: this
        # sums them over the ranks in place (see PagedLlama.split_across).
        self.all_reduce: Callable[[torch.Tensor], None] | None = None

    def forward(self, h, rotary, backend, layer_idx, lora=None):
        attn = self.self_attn(self.input_layernorm(h), rotary, backend, layer_idx, lora)
        if self.all_reduce is not None:
            self.all_reduce(attn)
        h = h + attn
        mlp = self.mlp(self.post_attention_layernorm(h), layer_idx, lora)
        if self.all_reduce is not None:
            self.all_reduce(mlp)
        return h + mlp


class Body(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(cfg) for _ in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)


class PagedLlama(nn.Module):
    """Llama decoder over token-flattened batches.

    Shapes: N tokens in the batch, H hidden size, V vocabulary. ``config`` is the shape of the
    weights held here: one rank's shard (:mod:`oven.inference.sharding`) under tensor parallelism.
    """

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.config = cfg
        self.model = Body(cfg)
        self.lm_head = None if cfg.tie_word_embeddings else nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        # RoPE: float32 inverse frequencies [head_dim / 2] and cos/sin scale. A plain
        # tuple, not a buffer, so casting the model to bf16 never rounds them.
        self.rope_params: tuple[torch.Tensor, float] = (torch.ones(cfg.head_dim // 2), 1.0)
        self.rope_kernel = None  # see use_flashinfer_kernels

    @property
    def dtype(self) -> torch.dtype:
        return self.model.embed_tokens.weight.dtype

    @property
    def device(self) -> torch.device:
        return self.model.embed_tokens.weight.device

    def embed(self, token_ids: torch.Tensor) -> torch.Tensor:
        """int64 [N] -> [N, H] in the model dtype."""
        return self.model.embed_tokens(token_ids)

    def forward(self, hidden: torch.Tensor, positions: torch.Tensor, backend: AttentionBackend,
                lora: LoraExecutor | None = None) -> torch.Tensor:
        """Input embeddings [N, H] at int64 ``positions`` [N] -> final normed hidden states [N, H].

        ``backend`` must have been planned for this batch; it writes every
        layer's K/V of the N tokens into their pages before attending. ``lora``,
        when given, has been planned for the batch's adapter rows.
        """
        rotary = Rotary(*self.rope(positions, hidden.dtype)) if self.rope_kernel is None else \
            self.rope_kernel.at(positions)
        for i, layer in enumerate(self.model.layers):
            hidden = layer(hidden, rotary, backend, i, lora)
        return self.model.norm(hidden)

    def use_flashinfer_kernels(self) -> None:
        """On CUDA: FlashInfer's fused RMSNorm and RoPE (one kernel each where the PyTorch code issues
        about six and ten). Outputs differ from the PyTorch ops by rounding only: both normalise and
        rotate in float32, FlashInfer rounds once at the end."""
        from flashinfer.norm import rmsnorm

        for module in self.modules():
            if isinstance(module, RMSNorm):
                module.kernel = rmsnorm
        self.rope_kernel = FlashInferRope(self.rope_params, self.config.max_position, self.config.head_dim)

    def split_across(self, all_reduce: Callable[[torch.Tensor], None]) -> None:
        """Make this model one rank's shard: ``all_reduce`` sums each layer's attention and MLP
        outputs over the ranks, in place, before they join the (replicated) residual stream."""
        for layer in self.model.layers:
            layer.all_reduce = all_reduce

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Final hidden states [M, H] -> float32 logits [M, V]."""
        if self.lm_head is not None:
            return self.lm_head(hidden).float()
        return (hidden @ self.model.embed_tokens.weight.T).float()

    def rope(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        inv_freq, scaling = self.rope_params
        freqs = positions[:, None].float() * inv_freq[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        return (emb.cos() * scaling).to(dtype), (emb.sin() * scaling).to(dtype)

    # -- weights ----------------------------------------------------------

    def load_safetensors(self, folder: Path, progress: bool = True, shard: Shard | None = None) -> None:
        """Copy every tensor of ``folder/*.safetensors`` into the matching parameter; given a ``shard``,
        only its slice of each is read."""
        from safetensors import safe_open
        from tqdm import tqdm

        params = dict(self.named_parameters())
        files = sorted(folder.glob("*.safetensors"))
        if not files:
            raise FileNotFoundError(f"{folder}: no *.safetensors files")
        loaded = set()
        for file in files:
            with safe_open(file, framework="pt") as f:
                for name in tqdm(list(f.keys()), desc=f"loading {file.name}", disable=not progress, unit="tensor"):
                    if name in params:
                        split = None if shard is None else shard.split(name)
                        if split is None:
                            params[name].data.copy_(f.get_tensor(name))
                        else:
                            dim, part = split
                            rows = f.get_slice(name)
                            params[name].data.copy_(rows[part] if dim == 0 else rows[:, part])
                        loaded.add(name)
        missing = sorted(set(params) - loaded)
        if missing:
            raise ValueError(f"{folder}: checkpoint lacks {len(missing)} tensors, e.g. {missing[:3]}")

    def init_random(self, seed: int, shard: Shard | None = None) -> None:
        """Deterministic random weights: N(0, 0.02) matrices, unit norms (same seed, same device -> same
        model); given a ``shard``, its slices of the whole model's weights."""
        gen = torch.Generator(device=self.device).manual_seed(seed)
        for name, param in self.named_parameters():
            if name.endswith("norm.weight"):
                param.data.fill_(1.0)
            elif shard is None or shard.split(name) is None:
                param.data.normal_(0.0, 0.02, generator=gen)
            else:  # the whole matrix drawn, so the generator's sequence is the unsharded model's
                full = param.new_empty(shard.full_shape(name, param.shape)).normal_(0.0, 0.02, generator=gen)
                param.data.copy_(shard.take(name, full))


class Rotary:
    """RoPE for one forward in PyTorch: cos/sin [N, D] of the batch's positions, computed once."""

    def __init__(self, cos: torch.Tensor, sin: torch.Tensor):
        self.cos, self.sin = cos, sin

    def __call__(self, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """q [N, q_heads, D], k [N, kv_heads, D] -> rotated."""
        return apply_rope(q, self.cos, self.sin), apply_rope(k, self.cos, self.sin)


class FlashInferRope:
    """RoPE by FlashInfer's ``apply_rope_with_cos_sin_cache_inplace`` over a float32 table of every position:
    ``[max_position, D]``, cos in the first half and sin in the second (Neox layout, as :func:`apply_rope`)."""

    def __init__(self, rope_params: tuple[torch.Tensor, float], max_position: int, head_dim: int):
        from flashinfer.rope import apply_rope_with_cos_sin_cache_inplace

        inv_freq, scaling = rope_params
        freqs = torch.arange(max_position, dtype=torch.float32, device=inv_freq.device)[:, None] * inv_freq[None, :]
        self.cache = torch.cat((freqs.cos() * scaling, freqs.sin() * scaling), dim=-1).contiguous()
        self.head_dim = head_dim
        self._apply = apply_rope_with_cos_sin_cache_inplace

    def at(self, positions: torch.Tensor) -> "FlashInferRotary":
        return FlashInferRotary(self, positions)


class FlashInferRotary:
    def __init__(self, rope: FlashInferRope, positions: torch.Tensor):
        self.rope, self.positions = rope, positions

    def __call__(self, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """q [N, q_heads, D], k [N, kv_heads, D], rotated in place."""
        rope = self.rope
        rope._apply(self.positions, q, k, rope.head_dim, rope.cache, is_neox=True)
        return q, k


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [N, heads, D], cos/sin [N, D] -> x rotated (the half-split layout transformers uses)."""
    return x * cos[:, None, :] + rotate_half(x) * sin[:, None, :]


class _NoRandomInit(TorchFunctionMode):
    """Modules built without their random initialisation: :func:`build_model` sets every weight after, and
    on the meta device the first random op imports torch's Python meta kernels (2 s of a process's start)."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if getattr(func, "__module__", None) == "torch.nn.init":
            return args[0] if args else kwargs["tensor"]  # the tensor, as it was
        return func(*args, **(kwargs or {}))


def build_model(source, device: torch.device, dtype: torch.dtype, seed: int = 0, progress: bool = True,
                cpu_packed_weights: bool = True, shard: Shard | None = None) -> PagedLlama:
    """Instantiate a :class:`PagedLlama` for a :class:`~oven.inference.models.ModelSource`, or a
    tensor-parallel rank's ``shard`` of it.

    On the CPU (and when oneDNN is available) linear layers get packed weights,
    a tied LM head included; see :class:`PackedLinear`. A shard is cut before packing.
    """
    inv_freq, scaling = rope_frequencies(source.settings)
    with torch.device(device), _NoRandomInit():  # its memory as torch.empty leaves it: every weight is set below
        model = PagedLlama(source.config if shard is None else shard.config).to(dtype)
    model.rope_params = (inv_freq.to(device), scaling)
    if source.weights_dir is None:
        log.info("initialising %s with random weights (seed %d)", source.name, seed)
        model.init_random(seed, shard)
    else:
        model.load_safetensors(Path(source.weights_dir), progress, shard)
    model.eval().requires_grad_(False)
    if cpu_packed_weights and device.type == "cpu" and torch.backends.mkldnn.is_available():
        if model.lm_head is None:  # a tied head gets its own packed layer over the shared matrix
            with _NoRandomInit():
                model.lm_head = nn.Linear(source.config.hidden_size, source.config.vocab_size, bias=False,
                                          device="meta")
            model.lm_head.weight = model.model.embed_tokens.weight
        pack_for_cpu(model)
    return model

"""The model to fine-tune, with LoRA adapters from PEFT, and the loss of one batch.

The base model is the one oven serves (``oven.inference.models.resolve_model``): the embedded
SmolLM2-135M-Instruct from its converted Hugging Face folder, or ``tiny`` (random weights from the
seed) for tests. Computation is fp32; only the adapter is trained.
"""

from __future__ import annotations

import warnings
from contextlib import contextmanager
from dataclasses import dataclass

import torch

from .batches import Batch

DEFAULT_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj")


@dataclass(frozen=True)
class LoraSettings:
    rank: int = 16
    alpha: float = 32.0
    targets: tuple[str, ...] = DEFAULT_TARGETS

    def __post_init__(self) -> None:
        if self.rank < 1:
            raise ValueError(f"LoRA rank must be >= 1, got {self.rank}")
        if not self.targets:
            raise ValueError("LoRA needs at least one target module")


def load_base(model_spec: str, seed: int):
    """A ``LlamaForCausalLM`` in fp32 for ``model_spec`` (random weights from ``seed`` if it has none)."""
    from transformers import AutoModelForCausalLM, LlamaForCausalLM

    from oven.inference.models import resolve_model

    source = resolve_model(model_spec)
    if source.weights_dir is not None:
        model = AutoModelForCausalLM.from_pretrained(source.weights_dir, dtype=torch.float32)
    else:
        torch.manual_seed(seed)
        model = LlamaForCausalLM(source.hf_config).to(torch.float32)
    return model, source


def with_lora(model, lora: LoraSettings):
    from peft import LoraConfig, get_peft_model

    config = LoraConfig(r=lora.rank, lora_alpha=lora.alpha, lora_dropout=0.0, target_modules=list(lora.targets),
                        bias="none", task_type="CAUSAL_LM")
    with _quiet_peft():
        return get_peft_model(model, config)


def with_adapter(model, folder):
    """``model`` running the PEFT adapter saved in ``folder`` (inference: its weights stay frozen)."""
    from peft import PeftModel

    with _quiet_peft():
        return PeftModel.from_pretrained(model, str(folder))


def with_adapters(model, folders) -> tuple[object, list[str]]:
    """``model`` holding every PEFT adapter in ``folders`` (frozen), and the names they are loaded under."""
    from peft import PeftModel

    names = [f"part{i}" for i in range(len(folders))]
    with _quiet_peft():
        peft_model = PeftModel.from_pretrained(model, str(folders[0]), adapter_name=names[0])
        for name, folder in zip(names[1:], folders[1:]):
            peft_model.load_adapter(str(folder), adapter_name=name)
    return peft_model, names


@contextmanager
def _quiet_peft():
    """PEFT 0.21 wraps a model by reading transformers' deprecated ``is_gradient_checkpointing``; the
    FutureWarning it prints is theirs to fix and tells an oven user nothing."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="`is_gradient_checkpointing` is deprecated", category=FutureWarning)
        yield


def batch_loss(model, batch: Batch) -> tuple[torch.Tensor, float]:
    """Weighted, summed cross-entropy over the batch's loss tokens, and the sum of their weights;
    plus, for each rejection, ``reject_weight`` times the unlikelihood ``-log(1 - p(rejected token))``
    (it pushes down the very token the model chose where it went wrong, not only raises the right one).

    The shared prefix is forwarded once (batch 1) and its KV cache repeated for the suffixes, which
    are right-padded; a pad comes after every real token of its row, so causal attention keeps it
    out of them. Logits are computed only where a loss token is predicted.
    """
    causal_lm = model.get_base_model() if hasattr(model, "get_base_model") else model
    num_rows = len(batch.suffix_ids)
    cache = None
    if batch.prefix_ids:
        cache = causal_lm.model(input_ids=torch.tensor([batch.prefix_ids]), use_cache=True).cache
        cache.batch_repeat_interleave(num_rows)
    width = max(len(s) for s in batch.suffix_ids)
    input_ids = torch.tensor([s + [0] * (width - len(s)) for s in batch.suffix_ids])
    weights = torch.tensor([w + [0.0] * (width - len(w)) for w in batch.suffix_weight])
    if (weights[:, 0] > 0).any():
        raise ValueError("a loss token at the start of a suffix: its prediction is in the prefix")
    start = len(batch.prefix_ids)
    position_ids = torch.arange(start, start + width).expand(num_rows, width)
    hidden = causal_lm.model(input_ids=input_ids, position_ids=position_ids, cache=cache,
                             use_cache=cache is not None).last_hidden_state
    rows_t, cols_t = (weights > 0).nonzero(as_tuple=True)
    logits = causal_lm.lm_head(hidden[rows_t, cols_t - 1]).float()
    losses = torch.nn.functional.cross_entropy(logits, input_ids[rows_t, cols_t], reduction="none")
    token_weights = weights[rows_t, cols_t]
    total = (losses * token_weights).sum()
    if batch.suffix_rejections:
        rows_r, cols_r, tokens_r = (torch.tensor(x) for x in zip(*(
            (b, j, token) for b, rejections in enumerate(batch.suffix_rejections) for j, token in rejections)))
        log_probs = causal_lm.lm_head(hidden[rows_r, cols_r - 1]).float().log_softmax(-1)
        rejected = log_probs[torch.arange(len(tokens_r)), tokens_r].exp()
        total = total + batch.reject_weight * -torch.log1p(-rejected.clamp(max=1 - 1e-6)).sum()
    return total, token_weights.sum().item()

"""A Hugging Face model folder read without transformers: its config.json and its tokenizer.

Importing transformers costs an inference process about 3 s of start on two cores and 1 s more of
interpreter teardown at exit, for little: a Llama folder's settings are config.json's numbers, and its
tokenizer is tokenizer.json, which ``tokenizers`` loads as transformers' fast tokenizer does. What
transformers would read differently is left to it (:func:`tokenizer_spec` falls back): a tokenizer
class that rebuilds the pipeline in code (transformers 5's ``Qwen2Tokenizer`` replaces tokenizer.json's
normalizer and pre-tokenizer with its own), a folder without tokenizer.json (a sentencepiece model), a
token named in tokenizer_config.json that tokenizer.json does not add, or several chat templates.
tests/test_hf_files.py holds both readings equal wherever this one is taken.
"""

from __future__ import annotations

import json
from pathlib import Path

from oven.proto.inference import TokenizerSpec

# LlamaConfig's values for the settings a config.json may leave out (held equal to it by the tests).
LLAMA_DEFAULTS = {"vocab_size": 32000, "hidden_size": 4096, "intermediate_size": 11008, "num_hidden_layers": 32,
                  "num_attention_heads": 32, "rms_norm_eps": 1e-6, "tie_word_embeddings": False,
                  "max_position_embeddings": 2048}
DEFAULT_ROPE_THETA = 10000.0
INT_SETTINGS = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                "num_key_value_heads", "head_dim", "max_position_embeddings")
SCALED_ROPE_TYPES = ("llama3", "yarn", "longrope")  # those that keep the pretraining context length

# Tokens that end an assistant turn in common chat formats, beyond the declared eos.
END_OF_TURN_TOKENS = ("<|im_end|>", "<|eot_id|>", "<|end_of_text|>", "<|endoftext|>", "</s>", "<|eom_id|>")
# Tokenizer classes for which transformers 5 takes tokenizer.json as it is.
TOKENIZER_JSON_AS_IS = (None, "PreTrainedTokenizerFast", "TokenizersBackend")
SPECIAL_TOKEN_KEYS = ("bos_token", "eos_token", "unk_token", "pad_token")


def read_json(path: Path) -> dict:
    try:
        settings = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"{path}: not valid JSON ({exc})") from None
    if not isinstance(settings, dict):
        raise ValueError(f"{path}: expected a JSON object")
    return settings


def llama_config(folder: Path) -> dict:
    """The folder's config.json as transformers' ``LlamaConfig`` reads it (see :func:`complete_llama_config`)."""
    config = read_json(folder / "config.json")
    if config.get("model_type") != "llama":
        raise ValueError(f"{folder}: model_type {config.get('model_type')!r} is not supported (llama only)")
    if config.get("rope_parameters") and config.get("rope_scaling"):
        from transformers import LlamaConfig  # which of the two wins is transformers' rule to keep

        return LlamaConfig.from_pretrained(folder).to_dict()
    return complete_llama_config(config, str(folder / "config.json"))


def complete_llama_config(config: dict, where: str = "config") -> dict:
    """``config`` with what ``LlamaConfig`` derives filled in: its defaults, ``num_key_value_heads``,
    ``head_dim``, and the RoPE settings gathered in ``rope_parameters`` as transformers 5 writes them."""
    config = {**LLAMA_DEFAULTS, **config}
    for key in INT_SETTINGS:
        value = config.get(key)
        if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value <= 0):
            raise ValueError(f"{where}: {key} must be a positive integer, not {value!r}")
    eps = config["rms_norm_eps"]
    if not isinstance(eps, (int, float)) or isinstance(eps, bool) or not 0 < eps < 1:
        raise ValueError(f"{where}: rms_norm_eps must be a number between 0 and 1, not {eps!r}")
    if config.get("num_key_value_heads") is None:
        config["num_key_value_heads"] = config["num_attention_heads"]
    if not config.get("head_dim"):
        config["head_dim"] = config["hidden_size"] // config["num_attention_heads"]
    rope = dict(config.pop("rope_scaling", None) or config.get("rope_parameters") or {})
    rope.setdefault("rope_type", rope.get("type", "default"))
    rope.setdefault("rope_theta", config.pop("rope_theta", DEFAULT_ROPE_THETA))
    if "partial_rotary_factor" in config:
        rope.setdefault("partial_rotary_factor", config["partial_rotary_factor"])
    if rope["rope_type"] in SCALED_ROPE_TYPES:
        if "original_max_position_embeddings" in config:
            rope["original_max_position_embeddings"] = config["original_max_position_embeddings"]
        rope.setdefault("original_max_position_embeddings", config["max_position_embeddings"])
    config["rope_parameters"] = rope
    return config


def generation_eos_ids(folder: Path) -> list[int]:
    """The end-of-sequence ids generation_config.json declares (none without it)."""
    path = folder / "generation_config.json"
    eos = read_json(path).get("eos_token_id") if path.is_file() else None
    return eos if isinstance(eos, list) else [eos] if eos is not None else []


def tokenizer_spec(folder: Path) -> TokenizerSpec:
    """The folder's tokenizer, from its files where transformers would take them as they are, else by
    transformers."""
    eos_ids = generation_eos_ids(folder)
    spec = _spec_from_files(folder, eos_ids)
    if spec is not None:
        return spec
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(folder)
    return TokenizerSpec(
        tokenizer_json=tokenizer.backend_tokenizer.to_str(),
        chat_template=tokenizer.chat_template or "",
        bos_token=tokenizer.bos_token or "",
        eos_token=tokenizer.eos_token or "",
        stop_token_ids=stop_token_ids(tokenizer.get_vocab(), tokenizer.eos_token_id, eos_ids),
    )


def stop_token_ids(vocab: dict[str, int], eos_id: int | None, eos_ids: list[int]) -> list[int]:
    stop = {eos_id, *eos_ids} | {vocab[t] for t in END_OF_TURN_TOKENS if t in vocab}
    return sorted(i for i in stop if i is not None)


def _spec_from_files(folder: Path, eos_ids: list[int]) -> TokenizerSpec | None:
    """None where transformers would read the tokenizer otherwise than as tokenizer.json has it."""
    import tokenizers

    path, settings_path = folder / "tokenizer.json", folder / "tokenizer_config.json"
    settings = read_json(settings_path) if settings_path.is_file() else {}
    if not path.is_file() or settings.get("tokenizer_class") not in TOKENIZER_JSON_AS_IS:
        return None
    tokenizer = tokenizers.Tokenizer.from_file(str(path))
    added = {token.content for token in tokenizer.get_added_tokens_decoder().values()}
    special = {key: _content(settings.get(key)) for key in SPECIAL_TOKEN_KEYS}
    extra = settings.get("extra_special_tokens") or settings.get("additional_special_tokens") or []
    named = [*special.values(), *map(_content, extra.values() if isinstance(extra, dict) else extra),
             *map(_content, (settings.get("added_tokens_decoder") or {}).values())]
    if any(name is not None and name not in added for name in named):
        return None  # transformers would add it
    template_file = folder / "chat_template.jinja"
    template = settings.get("chat_template")
    if (template is not None and template_file.is_file()) or not isinstance(template, (str, type(None))) \
            or (folder / "chat_template.json").is_file():
        return None
    if template is None and template_file.is_file():
        template = template_file.read_text(encoding="utf-8")
    eos = special["eos_token"]
    return TokenizerSpec(
        tokenizer_json=tokenizer.to_str(),
        chat_template=template or "",
        bos_token=special["bos_token"] or "",
        eos_token=eos or "",
        stop_token_ids=stop_token_ids(tokenizer.get_vocab(), tokenizer.token_to_id(eos) if eos else None, eos_ids),
    )


def _content(token) -> str | None:
    """A token as tokenizer_config.json names it: a string, or an added token's dict."""
    return token.get("content") if isinstance(token, dict) else token

"""Tokenize, detokenize and render chat templates in the control process (no model, no torch).

Built from the :class:`TokenizerSpec` an inference process reports in its
``info`` reply, so text never crosses a process boundary. Chat templates are
rendered like transformers does: a sandboxed Jinja2 environment with
``trim_blocks``/``lstrip_blocks``, ``raise_exception``, and a ``tojson``
filter that does not escape HTML.
"""

from __future__ import annotations

import json
from datetime import datetime

import jinja2
import jinja2.ext
import jinja2.sandbox
from tokenizers import Tokenizer as HfTokenizer

from oven.proto.inference import TokenizerSpec


def _raise(message: str):
    raise jinja2.exceptions.TemplateError(message)


def _tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False) -> str:
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


class Tokenizer:
    def __init__(self, spec: TokenizerSpec):
        self.spec = spec
        self._tok = HfTokenizer.from_str(spec.tokenizer_json)
        self.stop_token_ids = frozenset(spec.stop_token_ids)
        self._template = None
        if spec.chat_template:
            env = jinja2.sandbox.ImmutableSandboxedEnvironment(
                trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])
            env.filters["tojson"] = _tojson
            env.globals["raise_exception"] = _raise
            env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
            self._template = env.from_string(spec.chat_template)

    @property
    def vocab_size(self) -> int:
        return self._tok.get_vocab_size()

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text``; special tokens written in the text are recognised, none are added."""
        # The same ids as encode(); it skips the character offsets nobody here reads (about 3 us of
        # 18 for a short sentence, on the path of every tokenize call an inferlet makes).
        return self._tok.encode_batch_fast([text], add_special_tokens=False)[0].ids

    def decode(self, token_ids: list[int], skip_special_tokens: bool = False) -> str:
        return self._tok.decode(token_ids, skip_special_tokens=skip_special_tokens)

    def token_to_id(self, token: str) -> int | None:
        return self._tok.token_to_id(token)

    def render_chat(self, messages: list[dict], add_generation_prompt: bool = True) -> str:
        """The model's chat template applied to ``messages`` ([{"role": ..., "content": ...}])."""
        if self._template is None:
            raise ValueError("this model has no chat template")
        return self._template.render(messages=messages, add_generation_prompt=add_generation_prompt,
                                     bos_token=self.spec.bos_token, eos_token=self.spec.eos_token)

    def encode_chat(self, messages: list[dict], add_generation_prompt: bool = True) -> list[int]:
        return self.encode(self.render_chat(messages, add_generation_prompt))

"""The relevance scores' bookkeeping (training/relevance.py): the request's span in a sample's prompt,
the no-call reply's first token as samples write it, the AUC and the threshold table."""

from __future__ import annotations

from oven.client.asynclm.training.bfcl_tasks import IRRELEVANCE_KINDS
from oven.client.asynclm.training.data import DataConfig, build, parse_weights, prompt_of
from oven.client.asynclm.training.relevance import auc, markers, request_span, thresholds
from oven.client.asynclm.training.segments import Encoder
from oven.control.tokenizer import Tokenizer
from oven.inference.models import resolve_model


def test_the_span_is_the_user_request_and_the_marker_is_the_reply_first_token():
    tokenizer = Tokenizer(resolve_model("tiny").tokenizer)
    config = DataConfig(sources=IRRELEVANCE_KINDS, irrelevance_train=2, weights=parse_weights("async=1"))
    records = build("train", config, Encoder(tokenizer))[0]
    marks = markers(tokenizer)
    assert len(records) == 4
    for record in records:
        reply = record["loss_spans"][0][0]
        prompt = prompt_of(record)
        user, text, assistant = request_span(prompt, marks)
        assert tokenizer.decode(prompt[user:text]) == "<|im_start|>user\n"
        assert tokenizer.decode(prompt[assistant:]) == "<|im_start|>assistant\n"
        assert tokenizer.decode(prompt[text:assistant]).endswith("<|im_end|>\n")
        assert "<|im_start|>" not in tokenizer.decode(prompt[text:assistant])
        assert record["ids"][reply] == marks.no_call


def test_auc_counts_pairs_and_ties_half_and_thresholds_count_at_or_above():
    assert auc([2, 3], [1, 2]) == 3.5 / 4
    assert auc([1], [1]) == 0.5 and auc([0], [1]) == 0.0
    assert thresholds([4, 3, 2, 1], [3.5, 0], rows=2) == [(3, 2, 1), (1, 4, 1)]

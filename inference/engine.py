"""The batched handlers: one request = one batch of one call type, one outcome per item.

:class:`Engine` owns the model, the pools and the attention backend. Each
handler validates its items first (a bad item gets an :class:`ItemError` and
is left out of the batch), runs the good ones together, and returns the reply.
"""

from __future__ import annotations

import os

import logging
import time
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Callable, NamedTuple

import numpy as np
import torch

from oven.proto import grammar
from oven.proto import inference as p

from .adapters import AdapterError, AdapterLimits, AdapterRegistry, projection_shapes
from .attention import make_backend
from .attention.base import BatchLayout
from .config import InferenceConfig
from .cuda_graphs import DecodeGraphs
from .device import resolve_device, resolve_dtype
from .llama import PagedLlama, build_model
from .lora import Segment, make_lora_executor, merge_runs
from .memory import EmbedPool, HostKvTier, KvPagePool
from .models import ModelSource, resolve_model
from .sharding import Shard
from .shaping import (NOTHING_LEFT, Shaping, advance_matchers, check_shape, grammar_masks, sampled_logprobs,
                      shape_row)
from .tensor_parallel import TensorParallelGroup
from .token_futures import TokenFutures, check_sample, fail_samples, resolve_tokens, settle_samples
from .transfer import long_tensor
from .validate import (ItemFailure, Limits, check_context, check_ids, check_lengths, check_outputs,
                       check_positions, check_token_range, check_top_k, unpack_mask)

log = logging.getLogger(__name__)

TRAITS = [p.TRAIT_INPUT_TEXT, p.TRAIT_TOKENIZE, p.TRAIT_OUTPUT_TEXT, p.TRAIT_FORWARD,
          p.TRAIT_FORWARD_TEXT, p.TRAIT_KVPAGE_HOST_TIER, p.TRAIT_LORA_ADAPTERS]


DEFAULT_HOST_TIER_BYTES = 4 << 30


_USES_TOKEN_FUTURES = frozenset({p.ForwardTextRequest, p.FreeFuturesRequest, p.DropDecodersRequest})


class _Checked(NamedTuple):
    """A forward_text item that passed its checks: its tokens (futures resolved), mask, sampler and shaping."""

    token_ids: list[int]
    mask: object
    sampler: object
    shaping: Shaping | None


class BatchTooLarge(ValueError):
    """The whole request exceeds the batch limits; the server answers with an ErrorReply."""


class Engine:
    def __init__(self, cfg: InferenceConfig, progress: bool = True, source: ModelSource | None = None,
                 group: TensorParallelGroup | None = None):
        """``source``: ``cfg.model`` already resolved; ``group``: this rank's tensor-parallel group (None:
        the whole model here), whose device it uses and whose shard of the weights it holds."""
        self.cfg = cfg
        self.device = resolve_device(cfg.device) if group is None else group.device
        if cfg.torch_threads:
            torch.set_num_threads(cfg.torch_threads)
        elif self.device.type == "cpu":
            # Leave a core to the control process: its wasm slices run while the model computes,
            # and OpenMP threads sharing a core with it stall (AsyncLM demo on 2 cores: 1.25 s per
            # step with 2 threads against 0.11 s with 1). Tensor-parallel ranks share the rest.
            torch.set_num_threads(max(1, ((os.cpu_count() or 1) - 1) // (group.world_size if group else 1)))
        self.dtype = resolve_dtype(cfg.dtype, self.device)
        self.source: ModelSource = source or resolve_model(cfg.model)
        shard = None if group is None else Shard.of(self.source.config, group.rank, group.world_size)
        self.model: PagedLlama = build_model(self.source, self.device, self.dtype, cfg.seed, progress,
                                             cfg.cpu_packed_weights, shard)
        if group is not None:
            self.model.split_across(group.all_reduce)
        mc = self.model.config  # (a shard's: its heads and intermediate rows)
        # The same pools on every rank, though each sizes them by its own memory and share of the heads.
        agree = (lambda n: n) if group is None else group.agree_min
        num_pages = agree(cfg.num_kv_pages or self._pages_for_budget())
        num_host_pages = agree(cfg.num_host_pages or self._default_host_pages(num_pages))
        self.kv_pool = KvPagePool(mc, num_pages, cfg.page_size, self.dtype, self.device)
        self.embed_pool = EmbedPool(cfg.num_embeds, mc.hidden_size, self.dtype, self.device)
        self.host_tier = HostKvTier(self.kv_pool, num_host_pages)
        self.backend = make_backend(cfg.attention_backend, self.kv_pool, mc.num_q_heads)
        self.decode_graphs: DecodeGraphs | None = None
        if self.backend.name == "flashinfer":
            self.model.use_flashinfer_kernels()
            # (Not under tensor parallelism: all-reduces captured in a graph are not verified here.)
            if cfg.cuda_graph_max_batch and group is None:
                self.decode_graphs = DecodeGraphs(self.model, self.backend, self.kv_pool.scratch_page, num_pages,
                                                  min(cfg.cuda_graph_max_batch, cfg.max_batch_items))
        self.adapters = AdapterRegistry(self.source.config, AdapterLimits(cfg.max_adapters, cfg.max_adapter_rank,
                                                                          cfg.max_adapter_bytes), self.dtype,
                                        self.device, None if shard is None else shard.adapter)
        self.lora = make_lora_executor(self.device, self.dtype, self.backend.name,
                                       [n for shape in projection_shapes(mc).values() for n in shape])
        self.limits = Limits(num_pages, cfg.page_size, cfg.num_embeds, self.host_tier.num_slots,
                             mc.vocab_size, mc.max_position)
        self.started = time.monotonic()
        self.num_batches = self.num_items = self.num_item_errors = 0
        # The token future slots of in-process callers; the server passes each connection's own.
        self.token_futures = TokenFutures(self.llg_tokenizer)
        self._llg_tokenizer = None
        # Grammar matchers' work beside the forward (on first use; ``masks_beside_forward``): the masks of
        # a batch, the advances past its draws; one thread, in order, and ``_shape`` waits for the last
        # job sent to it.
        self.masks_beside_forward = True
        self._mask_worker: ThreadPoolExecutor | None = None
        self._mask_job: Future | None = None
        # Each request's handler is the method named by its wire tag (its call type, for a batch),
        # called with the request and the sender's token futures (only two handlers look at them).
        self.handlers: dict[type, Callable] = {cls: self._bind(cls) for cls in p.REQUESTS}
        log.info("%s on %s/%s%s, %s attention, %d pages of %d tokens, %d host slots, %d embeds",
                 mc.name, self.device, str(self.dtype).removeprefix("torch."),
                 f", tensor-parallel rank {group.rank} of {group.world_size}" if group else "", self.backend.name,
                 num_pages, cfg.page_size, self.host_tier.num_slots, cfg.num_embeds)

    def _pages_for_budget(self) -> int:
        page_bytes = self.model.config.kv_page_bytes(self.cfg.page_size, self.dtype.itemsize)
        budget = self.cfg.kv_memory_bytes
        if budget is None:
            budget = int(torch.cuda.mem_get_info()[0] * 0.85) if self.device.type == "cuda" else 512 << 20
        return max(1, budget // page_bytes)

    def _default_host_pages(self, num_pages: int) -> int:
        """As many as the device pool, but never more than DEFAULT_HOST_TIER_BYTES of (pinned) host memory."""
        page_bytes = self.model.config.kv_page_bytes(self.cfg.page_size, self.dtype.itemsize)
        return max(1, min(num_pages, DEFAULT_HOST_TIER_BYTES // page_bytes))

    def llg_tokenizer(self):
        """llguidance's view of the served tokenizer, built on the first grammar (about 0.3 s)."""
        if self._llg_tokenizer is None:
            tok = self.source.tokenizer
            self._llg_tokenizer = grammar.tokenizer(tok.tokenizer_json, self.limits.vocab_size, tok.stop_token_ids)
        return self._llg_tokenizer

    def _bind(self, cls: type) -> Callable:
        method = getattr(self, p.CODEC.tag(cls))
        return method if cls in _USES_TOKEN_FUTURES else (lambda request, _futures: method(request))

    def handle(self, request, futures: TokenFutures | None = None):
        """Dispatch a decoded request to its handler (KeyError for a type with none; BatchTooLarge for a
        batch past the limits, refused before any item is validated). ``futures``: the sending
        connection's token future slots (None: this engine's own, for in-process callers)."""
        if isinstance(request, p.BATCH_REQUESTS):
            self.check_batch_size(len(request.items), request)
        reply = self.handlers[type(request)](request, self.token_futures if futures is None else futures)
        if isinstance(request, p.BATCH_REQUESTS):
            self.num_batches += 1
            self.num_items += len(request.items)
            self.num_item_errors += sum(e is not None for e in reply.errors)
        return reply

    # -- embed / forward / sample -------------------------------------------

    def embed_text(self, req: p.EmbedTextRequest) -> p.AckReply:
        def check(item: p.EmbedTextItem):
            check_lengths(token_ids=item.token_ids, positions=item.positions, embed_ids=item.embed_ids)
            check_ids(item.token_ids, self.limits.vocab_size, p.ERR_BAD_TOKEN, "token")
            check_positions(self.limits, item.positions)
            check_ids(item.embed_ids, self.limits.num_embeds, p.ERR_BAD_EMBED, "embed")

        errors, good = self._validate(req.items, check)
        if good:
            items = [req.items[i] for i in good]
            tokens = self._long([t for it in items for t in it.token_ids])
            self.embed_pool.store([e for it in items for e in it.embed_ids],
                                  self.model.embed(tokens),
                                  self._long([q for it in items for q in it.positions]))
        return p.AckReply(errors)

    def forward(self, req: p.ForwardRequest) -> p.AckReply:
        def check(item: p.ForwardItem):
            num_inputs = len(item.input_embed_ids)
            kv_len = check_context(self.limits, item.kv_page_ids, item.kv_last_page_len, num_inputs)
            check_ids(item.input_embed_ids + item.output_embed_ids, self.limits.num_embeds, p.ERR_BAD_EMBED, "embed")
            unwritten = np.flatnonzero(~self.embed_pool.written[item.input_embed_ids])
            if unwritten.size:
                raise ItemFailure(p.ERR_BAD_EMBED, f"input embed {item.input_embed_ids[unwritten[0]]} was never written")
            check_lengths(output_indices=item.output_indices, output_embed_ids=item.output_embed_ids)
            check_outputs(item.output_indices, num_inputs)
            self._check_adapter(item.adapter_id)
            return unpack_mask(item.attention_mask, num_inputs, kv_len)

        errors, good = self._validate(req.items, check)
        if good:
            order = self._by_adapter(req.items, good)
            items = [req.items[i] for i in order]
            input_ids = self._long([e for it in items for e in it.input_embed_ids])
            hidden = self.embed_pool.embeds[input_ids]
            positions = self.embed_pool.positions[input_ids]
            layout = BatchLayout.build(self.cfg.page_size, [
                (it.kv_page_ids, it.kv_last_page_len, len(it.input_embed_ids), good[i]) for i, it in zip(order, items)])
            out = self._run(hidden, positions, layout, items)
            rows = self._output_rows(layout, order, {i: req.items[i].output_indices for i in good})
            self.embed_pool.store([e for i in good for e in req.items[i].output_embed_ids],
                                  out[rows], positions[rows])
        return p.AckReply(errors)

    def next_dist(self, req: p.NextDistRequest) -> p.NextDistReply:
        def check(item: p.NextDistItem):
            check_ids([item.embed_id], self.limits.num_embeds, p.ERR_BAD_EMBED, "embed")
            if not self.embed_pool.written[item.embed_id]:
                raise ItemFailure(p.ERR_BAD_EMBED, f"embed {item.embed_id} was never written")
            check_top_k(item.top_k, self.limits.vocab_size)

        errors, good = self._validate(req.items, check)
        dists: list[p.TopKDist | None] = [None] * len(req.items)
        if good:
            hidden = self.embed_pool.embeds[self._long([req.items[i].embed_id for i in good])]
            for i, dist in zip(good, self._top_k(hidden, [req.items[i].top_k for i in good])):
                dists[i] = dist
        return p.NextDistReply(errors, dists)

    def forward_text(self, req: p.ForwardTextRequest, futures: TokenFutures | None = None) -> p.ForwardTextReply:
        """One batch of forward-text items; ``futures``: the sender's token future slots (default: this
        engine's own, for callers in process such as the benches)."""
        futures = self.token_futures if futures is None else futures
        sampled_here = {it.sample.future_id for it in req.items if it.sample is not None}
        named_decoders: set[int] = set()

        def check(item: p.ForwardTextItem):
            num_inputs = check_lengths(token_ids=item.token_ids, positions=item.positions)
            kv_len = check_context(self.limits, item.kv_page_ids, item.kv_last_page_len, num_inputs)
            token_ids = resolve_tokens(item, futures, sampled_here)
            check_ids(token_ids, self.limits.vocab_size, p.ERR_BAD_TOKEN, "token")
            check_positions(self.limits, item.positions)
            check_outputs(item.output_indices, num_inputs)
            check_top_k(item.top_k, self.limits.vocab_size)
            self._check_adapter(item.adapter_id)
            sampler = check_sample(item, futures)
            shaping = check_shape(item.sample.shape if sampler else None, self.limits.vocab_size, futures.decoders,
                                  named_decoders)
            return _Checked(token_ids, unpack_mask(item.attention_mask, num_inputs, kv_len), sampler, shaping)

        errors, good = self._validate(req.items, check)
        raw: dict[int, torch.Tensor] = {}  # shaped items' unshaped logits, for their log-probabilities
        try:
            dists = self._forward_text_batch(req.items, good, errors, raw)
        except Exception as exc:  # the server answers every item with this; their slots must say so too
            fail_samples(req.items, futures, p.ItemError(p.ERR_INTERNAL, f"{type(exc).__name__}: {exc}"))
            raise
        good = {i: c for i, c in good.items() if errors[i] is None}
        sampled = settle_samples(req.items, errors, {i: c.sampler for i, c in good.items()}, dists, futures)
        logprobs: list[p.SampledLogprobs | None] = []
        advances = []  # matchers to move past their draws, beside the reply's trip and the next forward
        beside = self.masks_beside_forward
        for i, checked in good.items():
            if checked.shaping is None:
                continue
            if checked.shaping.decoder is not None:
                checked.shaping.decoder.draw(sampled[i], advance_matcher=not beside)
                if beside and checked.shaping.decoder.matcher is not None:
                    advances.append((checked.shaping.decoder, sampled[i]))
            if checked.shaping.logprobs >= 0:
                logprobs = logprobs or [None] * len(req.items)
                logprobs[i] = sampled_logprobs(raw[i], sampled[i], checked.shaping.logprobs)
        if advances:
            self._to_mask_worker(advance_matchers, advances)
        return p.ForwardTextReply(errors, dists, sampled, logprobs)

    def _forward_text_batch(self, items_in: list[p.ForwardTextItem], good: dict, errors: list,
                            raw: dict[int, torch.Tensor]) -> list[list[p.TopKDist] | None]:
        """The good items' distributions; a shaped item whose shaping allows no token gets its error in
        ``errors`` instead, and ``raw`` its unshaped logits."""
        dists: list[list[p.TopKDist] | None] = [None] * len(items_in)
        if not good:
            return dists
        order = self._by_adapter(items_in, good)
        items = [items_in[i] for i in order]
        hidden = self.model.embed(self._long([t for i in order for t in good[i].token_ids]))
        positions = self._long([q for it in items for q in it.positions])
        layout = BatchLayout.build(self.cfg.page_size, [
            (it.kv_page_ids, it.kv_last_page_len, len(it.token_ids), good[i].mask) for i, it in zip(order, items)])
        masks = self._grammar_masks_ahead(good)
        out = self._run(hidden, positions, layout, items)
        rows = self._output_rows(layout, order, {i: items_in[i].output_indices for i in good})
        top_ks = [items_in[i].top_k for i in good for _ in items_in[i].output_indices]
        shaped, row = {}, -1  # the row each shaped item draws from (its last): (item, its shaping, its tokens)
        for i in good:
            row += len(items_in[i].output_indices)
            if good[i].shaping is not None:
                shaped[row] = (i, good[i].shaping, good[i].token_ids)
        flat = iter(self._top_k(out[rows], top_ks, shaped, errors, raw, masks))
        for i in good:
            dists[i] = [next(flat) for _ in items_in[i].output_indices]
            if errors[i] is not None:
                dists[i] = None
        return dists

    def _grammar_masks_ahead(self, good: dict) -> Future | None:
        """The grammar masks of the good items under a grammar, computed on a worker thread while the
        forward runs (``shaping.grammar_masks``): the mask work is off the step's path unless it takes
        longer than the forward. One worker, in order: a batch's masks come after the previous batch's
        advances (``advance_matchers``)."""
        shapings = {i: c.shaping for i, c in good.items()
                    if c.shaping is not None and c.shaping.decoder is not None
                    and c.shaping.decoder.matcher is not None}
        if not shapings or not self.masks_beside_forward:
            return None
        return self._to_mask_worker(grammar_masks, shapings, self.limits.vocab_size)

    def _to_mask_worker(self, fn, *args) -> Future:
        if self._mask_worker is None:
            self._mask_worker = ThreadPoolExecutor(1, thread_name_prefix="grammar-masks")
        self._mask_job = self._mask_worker.submit(fn, *args)
        return self._mask_job

    def drop_decoders(self, req: p.DropDecodersRequest, futures: TokenFutures) -> p.AckReply:
        futures.decoders.drop(req.decoder_ids)
        return p.AckReply([])

    def free_futures(self, req: p.FreeFuturesRequest, futures: TokenFutures) -> p.AckReply:
        futures.free(req.future_ids)
        return p.AckReply([])

    # -- KvPage management --------------------------------------------------

    def copy_kvpage(self, req: p.CopyKvPageRequest) -> p.AckReply:
        def check(item: p.CopyKvPageItem):
            check_ids([item.src_page_id, item.dst_page_id], self.limits.num_pages, p.ERR_BAD_PAGE, "page")
            check_token_range(self.limits, item.src_offset, item.num_tokens, "source")
            check_token_range(self.limits, item.dst_offset, item.num_tokens, "destination")

        errors, good = self._validate(req.items, check)
        self.host_tier.before_use([p for i in good for p in (req.items[i].src_page_id, req.items[i].dst_page_id)])
        for i in good:  # in order: a later copy may read what an earlier one wrote
            it = req.items[i]
            self.kv_pool.copy_tokens(it.src_page_id, it.dst_page_id, it.src_offset, it.dst_offset, it.num_tokens)
        return p.AckReply(errors)

    def mask_kvpage(self, req: p.MaskKvPageRequest) -> p.AckReply:
        def check(item: p.MaskKvPageItem):
            check_ids([item.page_id], self.limits.num_pages, p.ERR_BAD_PAGE, "page")
            if len(item.masked) != self.limits.page_size:
                raise ItemFailure(p.ERR_BAD_ARGUMENT, f"masked must have {self.limits.page_size} entries")

        errors, good = self._validate(req.items, check)
        if good:
            self.kv_pool.set_mask([req.items[i].page_id for i in good], [req.items[i].masked for i in good])
        return p.AckReply(errors)

    def offload(self, req: p.OffloadRequest) -> p.AckReply:
        def check(item: p.OffloadItem):
            check_ids([item.page_id], self.limits.num_pages, p.ERR_BAD_PAGE, "page")
            check_ids([item.host_slot_id], self.limits.num_host_slots, p.ERR_BAD_PAGE, "host slot")

        errors, good = self._validate(req.items, check)
        if good:
            self.host_tier.offload([req.items[i].page_id for i in good], [req.items[i].host_slot_id for i in good])
        return p.AckReply(errors)

    def restore(self, req: p.RestoreRequest) -> p.AckReply:
        def check(item: p.RestoreItem):
            check_ids([item.page_id], self.limits.num_pages, p.ERR_BAD_PAGE, "page")
            check_ids([item.host_slot_id], self.limits.num_host_slots, p.ERR_BAD_PAGE, "host slot")
            if not self.host_tier.occupied[item.host_slot_id]:
                raise ItemFailure(p.ERR_BAD_PAGE, f"host slot {item.host_slot_id} holds no offloaded page")

        errors, good = self._validate(req.items, check)
        if good:
            self.host_tier.restore([req.items[i].host_slot_id for i in good], [req.items[i].page_id for i in good])
        return p.AckReply(errors)

    # -- adapters -------------------------------------------------------------

    def load_adapter(self, req: p.LoadAdapterRequest) -> p.AdapterReply | p.ErrorReply:
        loaded = self.adapters.by_id.get(req.adapter_id)
        try:
            adapter = self.adapters.load(req.adapter_id, req.name, req.path)
        except AdapterError as exc:
            log.warning("adapter %r refused: %s", req.name, exc)
            return p.ErrorReply(p.ERR_BAD_ADAPTER, str(exc))
        if adapter is loaded:  # the same load again: the executor's weights stand as they are
            return p.AdapterReply(adapter.info())
        self.lora.adapters_changed(list(self.adapters.by_id.values()))
        info = adapter.info()
        log.info("adapter %r loaded as id %d (rank %d, %s)", info.name, info.adapter_id, info.rank,
                 ", ".join(info.target_modules))
        return p.AdapterReply(info)

    def unload_adapter(self, req: p.UnloadAdapterRequest) -> p.AdapterReply | p.ErrorReply:
        try:
            adapter = self.adapters.unload(req.name)
        except AdapterError as exc:
            return p.ErrorReply(p.ERR_BAD_ADAPTER, str(exc))
        self.lora.adapters_changed(list(self.adapters.by_id.values()))
        return p.AdapterReply(adapter.info())

    # -- info -----------------------------------------------------------------

    def info(self, _req: p.InfoRequest) -> p.InfoReply:
        mc = self.model.config
        return p.InfoReply(
            model_name=mc.name, architecture="llama", vocab_size=mc.vocab_size, hidden_size=mc.hidden_size,
            num_layers=mc.num_layers, max_position=mc.max_position, device=str(self.device),
            dtype=str(self.dtype).removeprefix("torch."), attention_backend=self.backend.name,
            page_size=self.cfg.page_size, num_kv_pages=self.kv_pool.num_pages, num_embeds=self.cfg.num_embeds,
            num_host_pages=self.host_tier.num_slots, max_batch_items=self.cfg.max_batch_items,
            max_batch_tokens=self.cfg.max_batch_tokens, default_top_k=self.cfg.default_top_k,
            traits=list(TRAITS), tokenizer=self.source.tokenizer, max_adapters=self.cfg.max_adapters,
            adapters=[a.info() for a in self.adapters.by_id.values()])

    def health(self, _req: p.HealthRequest) -> p.HealthReply:
        return p.HealthReply(True, time.monotonic() - self.started, self.num_batches, self.num_items,
                             self.num_item_errors)

    # -- helpers --------------------------------------------------------------

    def _validate(self, items: list, check: Callable) -> tuple[list[p.ItemError | None], dict[int, object]]:
        """Run ``check`` on every item; return per-item errors and {index: check's result} of the good ones."""
        errors: list[p.ItemError | None] = [None] * len(items)
        good: dict[int, object] = {}
        for i, item in enumerate(items):
            try:
                good[i] = check(item)
            except ItemFailure as failure:
                errors[i] = failure.error
        return errors, good

    def check_batch_size(self, num_items: int, request=None) -> None:
        """BatchTooLarge if ``num_items`` (and, given the decoded ``request``, its tokens) exceed the
        limits. Tokens are counted only once the items are within theirs, so refusing a huge batch
        costs nothing; the server calls this with the count alone, before decoding the items."""
        if num_items > self.cfg.max_batch_items:
            raise BatchTooLarge(f"batch of {num_items} items exceeds the limit of {self.cfg.max_batch_items} "
                                "(max_batch_items)")
        if request is not None and (num_tokens := p.num_batch_tokens(request)) > self.cfg.max_batch_tokens:
            raise BatchTooLarge(f"batch of {num_tokens} tokens exceeds the limit of {self.cfg.max_batch_tokens} "
                                "(max_batch_tokens)")

    def _check_adapter(self, adapter_id: int) -> None:
        if adapter_id != p.BASE_MODEL and adapter_id not in self.adapters.by_id:
            raise ItemFailure(p.ERR_BAD_ADAPTER, f"adapter {adapter_id} is not loaded")

    @staticmethod
    def _by_adapter(items: list, good: dict[int, object]) -> list[int]:
        """The good items' indices in batch order: as they came, or, when some name an adapter, base items
        first and then grouped by adapter (stable), so each adapter's tokens are one run of rows."""
        if all(items[i].adapter_id == p.BASE_MODEL for i in good):
            return list(good)
        return sorted(good, key=lambda i: items[i].adapter_id)

    @torch.inference_mode()
    def _run(self, hidden: torch.Tensor, positions: torch.Tensor, layout: BatchLayout, items: list) -> torch.Tensor:
        """``items`` in layout order, as :meth:`_by_adapter` put them. Nothing here waits for the device:
        the caller reads the results when it needs them."""
        self.host_tier.before_use(layout.kv_page_ids)
        bounds = layout.qo_indptr.tolist()
        segments = [Segment(self.adapters.by_id[it.adapter_id], bounds[b], bounds[b + 1])
                    for b, it in enumerate(items) if it.adapter_id != p.BASE_MODEL and bounds[b + 1] > bounds[b]]
        if not segments and self.decode_graphs is not None and self.decode_graphs.accepts(layout):
            return self.decode_graphs.run(hidden, positions, layout)
        self.backend.plan(layout)
        if not segments:
            return self.model(hidden, positions, self.backend)
        self.lora.plan(merge_runs(segments))
        return self.model(hidden, positions, self.backend, self.lora)

    def _output_rows(self, layout: BatchLayout, order: list[int], output_indices: dict[int, list[int]]) -> torch.Tensor:
        """Rows of the outputs of each item, in the items' request order (``output_indices`` is keyed by
        request index; ``order`` is where each sits in the layout)."""
        position = {i: b for b, i in enumerate(order)}
        rows = [layout.qo_indptr[position[i]] + j for i, idx in output_indices.items() for j in idx]
        return self._long(rows)

    @torch.inference_mode()
    def _top_k(self, hidden: torch.Tensor, top_ks: list[int], shaped: dict | None = None, errors: list | None = None,
               raw: dict | None = None, masks: Future | None = None) -> list[p.TopKDist]:
        """Each row's top-K distribution; ``shaped``: {row: (item, Shaping)} to shape first (see
        ``_forward_text_batch`` for ``errors`` and ``raw``; ``masks``: their grammar masks, if any)."""
        if not top_ks:
            return []
        ks = [k or self.cfg.default_top_k for k in top_ks]
        logits = self.model.logits(hidden)
        if shaped:
            logits = self._shape(logits, shaped, errors, raw, {} if masks is None else masks.result())
        top_logits, ids = torch.topk(logits, min(max(ks), logits.shape[-1]), dim=-1)
        # Probabilities of the top K only: exp(logit - logsumexp), no full softmax materialised.
        values = torch.exp(top_logits - torch.logsumexp(logits, dim=-1, keepdim=True))
        values = values.cpu().numpy().astype("<f4")
        ids = ids.cpu().numpy().astype("<i4")
        if shaped:  # a shaped row's excluded tokens are no part of its distribution
            ks = [int(np.count_nonzero(values[r, :k])) if r in shaped else k for r, k in enumerate(ks)]
            for r, (i, _, _) in shaped.items():
                if errors[i] is None and not values[r, 0] > 0:  # every logit -inf: NaN
                    errors[i] = p.ItemError(p.ERR_BAD_ARGUMENT, NOTHING_LEFT)
        return [p.TopKDist(ids[r, :k].tobytes(), values[r, :k].tobytes()) for r, k in enumerate(ks)]

    def _shape(self, logits: torch.Tensor, shaped: dict, errors: list, raw: dict, masks: dict) -> torch.Tensor:
        """``logits`` with the shaped rows shaped (on the CPU, in float32: the masks and matchers live
        there; float32 logits on the CPU are shaped where they lie, others through a copy); a row whose
        shaping fails its item may be left half shaped: that item's distributions are dropped with it."""
        job, self._mask_job = self._mask_job, None
        if job is not None:
            job.result()  # matchers advanced (a mask computed here reads them): normally done already
        rows = list(shaped)
        in_place = logits.device.type == "cpu" and logits.dtype == torch.float32  # the model's fresh output
        host = logits if in_place else logits[rows].float().cpu()
        for j, r in enumerate(rows):
            i, shaping, tokens = shaped[r]
            row = host[r] if in_place else host[j]
            if shaping.logprobs >= 0:
                raw[i] = row.clone()
            try:
                shape_row(row, shaping, tokens, masks.get(i))
            except ItemFailure as failure:
                errors[i] = failure.error
        if in_place:
            return logits
        logits = logits.float()  # the model's fresh output (a copy when it was not float32): written in place
        logits[rows] = host.to(logits.device)
        return logits

    def _long(self, values: list[int]) -> torch.Tensor:
        return long_tensor(values, self.device)


"""Messages between the control layer and an inference process.

Transport: ZeroMQ, the inference process binds a ROUTER, the control layer
connects a DEALER. Every frame is one envelope of :data:`CODEC`. One request
carries one batch of a single call type; its reply carries one outcome per item,
in order, so a bad item fails alone. All ids here are *physical* ids: the
inference layer never sees an inferlet's virtual handles and makes no policy
decision.

Conventions shared by the forward calls:

* A context is a list of KvPage ids plus ``kv_last_page_len`` (1..page_size),
  the number of valid tokens in the last page *after* the call, FlashInfer
  style. Its length is ``(len(kv_page_ids) - 1) * page_size + kv_last_page_len``.
* The call's inputs are the *last* ``num_inputs`` tokens of that context: their
  K/V are written there, and they attend causally to everything before them.
* ``attention_mask`` (optional) has one entry per input: the bits of
  ``numpy.packbits(bool_row)`` over the whole context, 1 = may attend. It is
  combined (AND) with causality and with the page mask set by ``MaskKvPage``.
* Distributions are top-K, sorted by probability (descending); ``token_ids``
  is little-endian int32 bytes and ``probs`` little-endian float32 bytes.
* ``adapter_id`` (``forward`` and ``forward_text`` items) picks the LoRA adapter
  the item's tokens run through: 0 is the base model, any other value an id
  that ``load_adapter`` returned. Items of one batch may name different
  adapters. An id that is not loaded fails that item alone (``bad_adapter``).

LoRA adapters (Pie's ``forward_with_adapter``): ``load_adapter`` reads a PEFT
LoRA folder (``adapter_config.json`` + ``adapter_model.safetensors``; never a
pickle) that the control process names, checks it against the served model and
loads it under the id the control process chose, and answers an
:class:`AdapterReply`, or an :class:`ErrorReply` of code ``bad_adapter`` whose
message says what is wrong. The control process owns the ids, so that after a
restart of this process it loads every adapter again under the same id and
instances holding an id go on unchanged; it never gives an id to another
adapter, so an item sent with the id of an adapter unloaded meanwhile fails
instead of running on another adapter. ``unload_adapter`` frees one by name;
``info`` lists those loaded.

Token futures (xLLM's asynchronous schedule, SGLang's future map): a ``forward_text`` item with a
``sample`` has this process draw its next token with one of the SDK samplers (``SampleSpec``, the
algorithm of sdk/README.md "Seeded sampling", bit for bit) from the top-``top_k`` distribution
at its last output index, the one the inferlet would have been sent; the token is kept in the
future slot ``sample.future_id`` of the sending connection and returned in
``ForwardTextReply.sampled``. A later item may name that slot in ``token_futures`` instead of a
token: requests of one connection run in order, so the sender need not wait for the reply
first. The sender owns the slot ids (so it can name a slot before the reply arrives); a slot
holds its token (or its failure: a sampling item that failed fails its slot too) until a
``free_futures`` request drops it or a later sample reuses the id. An item that names a slot
that is free, failed, or sampled by an item of the same request fails alone (``bad_future``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .codec import Codec

PROTOCOL_VERSION = 6  # 2: adapters (ForwardItem.adapter_id, InfoReply.adapters); 3: LoadAdapterRequest.adapter_id;
# 4: timeline; 5: token futures (ForwardTextItem.sample and .token_futures, free_futures); 6: shaping (SampleSpec.shape,
# ForwardTextReply.logprobs, drop_decoders)

# Traits (Pie §4.4) a model served by an inference process may implement.
TRAIT_INPUT_TEXT = "input_text"
TRAIT_TOKENIZE = "tokenize"
TRAIT_OUTPUT_TEXT = "output_text"
TRAIT_FORWARD = "forward"
TRAIT_FORWARD_TEXT = "forward_text"
TRAIT_KVPAGE_HOST_TIER = "kvpage_host_tier"
TRAIT_LORA_ADAPTERS = "lora_adapters"

BASE_MODEL = 0  # the adapter_id of items that run on the base model


# -- items ------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class EmbedTextItem:
    """Store the embedding of ``token_ids[i]`` at position ``positions[i]`` in ``embed_ids[i]``."""

    token_ids: list[int]
    positions: list[int]
    embed_ids: list[int]


@dataclass(frozen=True, slots=True)
class ForwardItem:
    """Run input embeds through the model over a paged context.

    ``output_indices[j]`` (an index into ``input_embed_ids``) selects the input
    whose final hidden state is stored in ``output_embed_ids[j]``.
    """

    kv_page_ids: list[int]
    kv_last_page_len: int
    input_embed_ids: list[int]
    output_indices: list[int]
    output_embed_ids: list[int]
    attention_mask: list[bytes] | None = None
    adapter_id: int = BASE_MODEL


@dataclass(frozen=True, slots=True)
class NextDistItem:
    """Top-``top_k`` next-token distribution of an output embed (``top_k`` 0 = server default)."""

    embed_id: int
    top_k: int = 0


# The SDK samplers a SampleSpec may name (sdk/python/inferlet/sampling.py), by their wire names.
SAMPLE_GREEDY, SAMPLE_TEMPERATURE, SAMPLE_TOP_K, SAMPLE_TOP_P, SAMPLE_MIN_P = (
    "greedy", "temperature", "top_k", "top_p", "min_p")
SAMPLE_KINDS = (SAMPLE_GREEDY, SAMPLE_TEMPERATURE, SAMPLE_TOP_K, SAMPLE_TOP_P, SAMPLE_MIN_P)


@dataclass(frozen=True, slots=True)
class DecoderSpec:
    """A decoder's state as it starts (see the module docstring, "Shaping"). ``grammar``: llguidance's
    grammar text (proto/grammar.py), "" for none. Penalties as OpenAI's (``presence``, ``frequency``:
    subtracted from a token's logit once it was drawn / per time it was drawn under this decoder) and
    vLLM's (``repetition``: a logit of a token seen in the decoder's inputs or draws is divided by it
    if positive, multiplied if negative; 1 is none)."""

    grammar: str = ""
    presence: float = 0.0
    frequency: float = 0.0
    repetition: float = 1.0


@dataclass(frozen=True, slots=True)
class ShapeSpec:
    """How a sampling item's logits are shaped before its draw. ``allowed``: None for every token,
    else ``numpy.packbits`` of a boolean row over the vocabulary (1 = may be drawn). ``bias_ids`` /
    ``bias_values``: int32 / float32 little-endian, added to those logits. ``decoder_id``: -1 or a
    decoder of this connection; ``decoder``: its spec, on the first item that names it.
    ``logprobs``: -1 for none, else the drawn token's log-probability and the ``logprobs`` most
    probable tokens' (ForwardTextReply.logprobs)."""

    allowed: bytes | None = None
    bias_ids: bytes = b""
    bias_values: bytes = b""
    decoder_id: int = -1
    decoder: DecoderSpec | None = None
    logprobs: int = -1


@dataclass(frozen=True, slots=True)
class SampleSpec:
    """Draw the next token in this process, as the SDK sampler ``kind`` would, into future slot ``future_id``.

    ``param`` is TopK's ``k``, TopP's or MinP's ``p`` (unused by the others). ``rng_state`` is the
    sampler's SplitMix64 state *before* this draw (its ``Rng.state``): the generator is
    counter-based (state = seed + draws x 0x9E3779B97F4A7C15 mod 2**64), so a sender that keeps
    several samples in flight gives the k-th one its state plus k times that constant, and every
    sampler but greedy makes exactly one draw per sample.
    """

    future_id: int
    kind: str
    temperature: float = 1.0
    param: float = 0.0
    rng_state: int = 0
    shape: ShapeSpec | None = None


@dataclass(frozen=True, slots=True)
class ForwardTextItem:
    """Fused embed + forward + next-dist: tokens in, distributions at ``output_indices`` out.

    ``token_futures``: None, or one entry per token: -1 takes ``token_ids[i]``, any other value is
    a future slot whose token replaces it. ``sample``: draw a token from the distribution of the
    last output index (see the module docstring, "Token futures").
    """

    token_ids: list[int]
    positions: list[int]
    kv_page_ids: list[int]
    kv_last_page_len: int
    output_indices: list[int]
    top_k: int = 0
    attention_mask: list[bytes] | None = None
    adapter_id: int = BASE_MODEL
    token_futures: list[int] | None = None
    sample: SampleSpec | None = None


@dataclass(frozen=True, slots=True)
class CopyKvPageItem:
    """Copy ``num_tokens`` token slots (K, V and mask bits, every layer) between pages."""

    src_page_id: int
    dst_page_id: int
    src_offset: int
    dst_offset: int
    num_tokens: int


@dataclass(frozen=True, slots=True)
class MaskKvPageItem:
    """Set the page's mask bits: ``masked[i]`` True hides token slot i from later forwards."""

    page_id: int
    masked: list[bool]


@dataclass(frozen=True, slots=True)
class OffloadItem:
    """Copy GPU-tier page ``page_id`` (all layers, mask bits) into host slot ``host_slot_id``."""

    page_id: int
    host_slot_id: int


@dataclass(frozen=True, slots=True)
class RestoreItem:
    """Copy host slot ``host_slot_id`` back into GPU-tier page ``page_id``."""

    host_slot_id: int
    page_id: int


@dataclass(frozen=True, slots=True)
class TopKDist:
    token_ids: bytes  # int32 little-endian
    probs: bytes  # float32 little-endian


@dataclass(frozen=True, slots=True)
class ItemError:
    code: str  # one of the ERR_* constants
    message: str


ERR_BAD_PAGE = "bad_page"
ERR_BAD_EMBED = "bad_embed"
ERR_BAD_POSITION = "bad_position"
ERR_BAD_TOKEN = "bad_token"
ERR_BAD_ARGUMENT = "bad_argument"
ERR_BAD_ADAPTER = "bad_adapter"  # an item's unknown adapter_id; also the ErrorReply code of a refused load
ERR_BAD_FUTURE = "bad_future"  # a token future slot that is free, failed, or sampled in the same request
ERR_INTERNAL = "internal"


# -- requests ---------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class EmbedTextRequest:
    items: list[EmbedTextItem]


@dataclass(frozen=True, slots=True)
class ForwardRequest:
    items: list[ForwardItem]


@dataclass(frozen=True, slots=True)
class NextDistRequest:
    items: list[NextDistItem]


@dataclass(frozen=True, slots=True)
class ForwardTextRequest:
    items: list[ForwardTextItem]


@dataclass(frozen=True, slots=True)
class DropDecodersRequest:
    """Forget the sending connection's decoders ``decoder_ids`` (unknown ones are ignored); answered with
    an empty :class:`AckReply`. Sent after every item that names them."""

    decoder_ids: list[int]


@dataclass(frozen=True, slots=True)
class CopyKvPageRequest:
    items: list[CopyKvPageItem]


@dataclass(frozen=True, slots=True)
class MaskKvPageRequest:
    items: list[MaskKvPageItem]


@dataclass(frozen=True, slots=True)
class OffloadRequest:
    items: list[OffloadItem]


@dataclass(frozen=True, slots=True)
class RestoreRequest:
    items: list[RestoreItem]


@dataclass(frozen=True, slots=True)
class LoadAdapterRequest:
    """Load the PEFT LoRA folder at ``path`` (on the inference host) as ``adapter_id`` (>= 1) under ``name``.

    Refused with ``ErrorReply(bad_adapter, ...)`` when the id or the name is
    taken, the adapter slots are full, or the folder does not fit the served model.
    """

    adapter_id: int
    name: str
    path: str


@dataclass(frozen=True, slots=True)
class UnloadAdapterRequest:
    """Drop the adapter loaded as ``name``; items naming its id fail from now on."""

    name: str


@dataclass(frozen=True, slots=True)
class FreeFuturesRequest:
    """Drop the sending connection's token future slots ``future_ids`` (free ones are ignored);
    answered with an empty :class:`AckReply`."""

    future_ids: list[int]


@dataclass(frozen=True, slots=True)
class InfoRequest:
    pass


@dataclass(frozen=True, slots=True)
class HealthRequest:
    pass


@dataclass(frozen=True, slots=True)
class TimelineRequest:
    """The batches the server ran, as far back as its timeline keeps (``--timeline-batches``); ``clear``
    empties it after the reply."""

    clear: bool = False


def num_batch_tokens(request) -> int:
    """What a batch request costs against ``InfoReply.max_batch_tokens``: the input tokens of its
    ``embed_text``, ``forward`` and ``forward_text`` items, 1 for any other item. A request with more
    than ``max_batch_items`` items or more tokens than that is refused whole (``batch_too_large``)
    before any of its items is looked at."""
    if isinstance(request, (EmbedTextRequest, ForwardTextRequest)):
        return sum(len(item.token_ids) for item in request.items)
    if isinstance(request, ForwardRequest):
        return sum(len(item.input_embed_ids) for item in request.items)
    return len(request.items)


# -- replies ----------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class AckReply:
    """Reply to a batch with no payload per item: ``errors[i]`` is None when item i succeeded."""

    errors: list[ItemError | None]


@dataclass(frozen=True, slots=True)
class NextDistReply:
    errors: list[ItemError | None]
    dists: list[TopKDist | None]


@dataclass(frozen=True, slots=True)
class SampledLogprobs:
    """The drawn token's log-probability and the top ones' (ids int32, values float32 little-endian,
    most probable first), of the model's distribution before shaping."""

    logprob: float
    top_ids: bytes
    top_logprobs: bytes


@dataclass(frozen=True, slots=True)
class ForwardTextReply:
    errors: list[ItemError | None]
    dists: list[list[TopKDist] | None]  # one distribution per output index
    sampled: list[int | None] = field(default_factory=list)  # per item: its sampled token (empty: none sampled)
    logprobs: list[SampledLogprobs | None] = field(default_factory=list)  # per item (empty: none asked for)


@dataclass(frozen=True, slots=True)
class AdapterInfo:
    """A loaded LoRA adapter. ``scale`` is what the update ``B @ A`` is multiplied by:
    ``lora_alpha / rank``, or ``lora_alpha / sqrt(rank)`` with rsLoRA."""

    adapter_id: int
    name: str
    rank: int
    lora_alpha: float
    scale: float
    target_modules: list[str]  # projection names, e.g. ["q_proj", "v_proj"]
    num_params: int


@dataclass(frozen=True, slots=True)
class AdapterReply:
    """Reply to load_adapter (the adapter now loaded) and unload_adapter (the one dropped)."""

    adapter: AdapterInfo


@dataclass(frozen=True, slots=True)
class TokenizerSpec:
    """Everything the control layer needs to tokenize without crossing processes."""

    tokenizer_json: str  # a `tokenizers.Tokenizer` serialised with to_str()
    chat_template: str  # Jinja2, Hugging Face conventions; "" when the model has none
    bos_token: str
    eos_token: str
    stop_token_ids: list[int]  # eos and end-of-turn ids


@dataclass(frozen=True, slots=True)
class InfoReply:
    model_name: str
    architecture: str
    vocab_size: int
    hidden_size: int
    num_layers: int
    max_position: int
    device: str
    dtype: str
    attention_backend: str
    page_size: int
    num_kv_pages: int
    num_embeds: int
    num_host_pages: int
    max_batch_items: int
    max_batch_tokens: int
    default_top_k: int
    traits: list[str]
    tokenizer: TokenizerSpec
    max_adapters: int = 0  # how many adapters may be loaded at once
    adapters: list[AdapterInfo] = field(default_factory=list)  # loaded now, by id


@dataclass(frozen=True, slots=True)
class HealthReply:
    ok: bool
    uptime_s: float
    num_batches: int
    num_items: int
    num_item_errors: int


@dataclass(frozen=True, slots=True)
class TimelineReply:
    """One entry per batch, oldest first: its call type, items, and start and end (ns, the server's
    monotonic clock: only differences mean anything). ``capacity`` 0: the timeline is off."""

    call_types: list[str]
    num_items: list[int]
    starts_ns: list[int]
    ends_ns: list[int]
    capacity: int


@dataclass(frozen=True, slots=True)
class ErrorReply:
    """The whole message was rejected (malformed, unknown type, wrong version)."""

    code: str
    message: str


@dataclass(frozen=True, slots=True)
class IdleNotice:
    """Unsolicited: the server has nothing queued. Sent with request_id 0."""

    num_batches: int


CODEC = Codec(
    PROTOCOL_VERSION,
    {
        "embed_text": EmbedTextRequest,
        "forward": ForwardRequest,
        "next_dist": NextDistRequest,
        "forward_text": ForwardTextRequest,
        "copy_kvpage": CopyKvPageRequest,
        "mask_kvpage": MaskKvPageRequest,
        "offload": OffloadRequest,
        "restore": RestoreRequest,
        "load_adapter": LoadAdapterRequest,
        "unload_adapter": UnloadAdapterRequest,
        "free_futures": FreeFuturesRequest,
        "drop_decoders": DropDecodersRequest,
        "info": InfoRequest,
        "health": HealthRequest,
        "timeline": TimelineRequest,
        "ack": AckReply,
        "next_dist_reply": NextDistReply,
        "forward_text_reply": ForwardTextReply,
        "adapter_reply": AdapterReply,
        "info_reply": InfoReply,
        "health_reply": HealthReply,
        "timeline_reply": TimelineReply,
        "error": ErrorReply,
        "idle": IdleNotice,
    },
)

# Call types are the wire tags of the batch requests, named once in the table above.
BATCH_REQUESTS = (
    EmbedTextRequest,
    ForwardRequest,
    NextDistRequest,
    ForwardTextRequest,
    CopyKvPageRequest,
    MaskKvPageRequest,
    OffloadRequest,
    RestoreRequest,
)
REQUESTS = BATCH_REQUESTS + (LoadAdapterRequest, UnloadAdapterRequest, FreeFuturesRequest, DropDecodersRequest,
                             InfoRequest, HealthRequest)
REQUEST_BY_CALL_TYPE: dict[str, type] = {CODEC.tag(cls): cls for cls in BATCH_REQUESTS}
CALL_TYPES = frozenset(REQUEST_BY_CALL_TYPE)

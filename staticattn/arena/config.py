"""Capacities of one arena: everything that fixes a buffer's shape.

An :class:`ArenaConfig` is frozen and validated at construction; every buffer the builders
declare is sized from it, so nothing has to grow at run time.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import torch

from staticattn.arena.bounds import check_bounds, check_image_capacity
from staticattn.arena.dcp_rules import check_dcp
from staticattn.arena.device import check_device, device_sm_count
from staticattn.errors import ConfigError
from staticattn.model import LayerType, Reads, architecture, layer_type, model_preset
from staticattn.model.layer_types import LAYER_TYPES, Cache
from staticattn.model.sources import LayerSources, resolve_sources

__all__ = ["ArenaConfig", "cdiv", "round_up"]

#: Query lengths the paged-MQA-logits kernels take natively on Hopper (larger next_n flattens).
NATIVE_NEXT_N = (1, 2)


def cdiv(a: int, b: int) -> int:
    """Ceiling division of non-negative ints."""
    return -(-a // b)


def round_up(a: int, b: int) -> int:
    """``a`` rounded up to a multiple of ``b``."""
    return cdiv(a, b) * b


def _default_device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


@dataclass(frozen=True, slots=True)
class ArenaConfig:
    """Frozen, validated capacities of an arena.

    Parameters
    ----------
    max_num_seqs : int
        Requests per step, at most.
    max_num_batched_tokens : int
        Tokens per step (all requests together), at most.
    max_model_len : int
        Longest sequence (context + scheduled tokens) a request may reach: at least a block
        and ``next_n``, at most what int32 offsets hold (:mod:`staticattn.arena.bounds`).
    block_size : int
        Uncompressed tokens per KV block of the main cache group (indexer and compressed
        caches): 64 for DeepSeek V3.2, 256 for DeepSeek V4.
    num_speculative_tokens : int
        MTP draft tokens per decode step; ``next_n = 1 + num_speculative_tokens``.
    architecture : str
        The model family, whose encoding maps ``compress_ratios`` to layer types
        (:data:`staticattn.model.ARCHITECTURES`): "deepseek_v32", "deepseek_v4" or
        "deepseek_v41".
    compress_ratios : tuple of int
        One compress ratio per layer, in the family's encoding (``(1,)`` for V3.2; V4: 1 =
        SWA-only, 4 = C4A, 128 = C128A; V4.1: 0 = SWA-only, 1 = c1a, 2 = c2a). The layer
        types present (:attr:`layer_types`) decide every per-type buffer and output.
    kv_source_layers, index_source_layers : tuple of int or None
        DeepSeek V4.1's cache sharing: the layers that own the compressed caches, and those
        that run the indexer; every other compressed layer reads the nearest source at or
        below it (:mod:`staticattn.model.sources`, which checks them). None: every
        compressed layer is its own source.
    sliding_window : int or None
        Window of the sparse sliding-window attention (128 for V4); None when the model has
        no SWA layers.
    swa_block_size : int
        Tokens per block of the SWA cache group (64 for V4).
    index_topk : int
        Keys the indexer keeps per query token.
    max_image_tokens, max_image_spans : int
        DeepSeek V4's vision variant (``vllm-0.33-extras.md`` §3): ``mit``, the longest
        image span's reach (prefill SWA rows ``W + mit`` wide), and the spans one step may
        carry (:func:`~staticattn.arena.bounds.check_image_capacity`). 0: a text model.
    max_prefill_workspace : int or None
        Compressed keys one indexer prefill chunk may gather; default ``40 * max_model_len``.
    max_logits_bytes : int
        Logits budget of one indexer prefill chunk (fp32), default 512 MiB.
    dense_prefill_workspace_bytes : int
        Device bytes of the C128A prefill rows' workspace, which holds them a chunk of
        prefill tokens at a time (:func:`~staticattn.builders.swa.declarations.
        dense_prefill_chunk_rows`); default 16 MiB, whatever ``max_model_len``.
    dcp_world_size : int
        Decode-context-parallel ranks the sharded caches are dealt over (1: none): the main
        cache group's KV, and DeepSeek V4.1's compressed KV and index-K groups. Each rank
        owns its arena; its main block table holds the rank's local blocks, one column per
        ``block_size * dcp_world_size`` tokens, and so do the sharded groups' tables
        (:mod:`staticattn.arena.groups`). The SWA group, the C128A entries and the
        compressor rings are replicated on every rank (see
        :mod:`staticattn.builders.swa.builder`).
    dcp_rank : int
        This arena's rank in ``[0, dcp_world_size)``: a static int of the rank's arena and
        graphs, never read from the device.
    cp_kv_cache_interleave_size : int
        ``I``: tokens dealt to a rank at a time; positions ``[k I, (k + 1) I)`` live on rank
        ``k % dcp_world_size``. With ``dcp_world_size > 1`` it must divide ``block_size`` and
        be a multiple of every sharded compress ratio (the indexers' and the sharded types':
        C4A, c1a, c2a; not C128A's, which is replicated), so no compressed entry straddles
        two ranks (:mod:`staticattn.arena.dcp_rules`).
    device : str
        Where the arena lives: ``"cuda"``, ``"cuda:1"``, ``"cpu"``. Default: CUDA if present.
    num_sms : int or None
        Multiprocessors the paged-MQA-logits schedule is split over; default: the device's
        count on CUDA, 132 (an H100/H200) elsewhere.
    use_flattening : bool or None
        Whether the indexer flattens MTP decodes into single-token rows; default: the
        Hopper rule, flatten iff ``next_n`` is not in (1, 2).
    kernel_backend : {"auto", "torch", "triton"}
        "auto" runs Triton kernels on CUDA and plain-torch kernels elsewhere. "triton" on a
        CPU needs ``TRITON_INTERPRET=1`` set before Triton is imported.

    Examples
    --------
    >>> cfg = ArenaConfig.deepseek_v4(max_model_len=8192, device="cpu")
    >>> cfg.next_n, cfg.storage_block_size, cfg.max_decode_tokens
    (2, 64, 512)
    """

    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    max_model_len: int = 163840
    block_size: int = 64
    num_speculative_tokens: int = 0
    architecture: str = "deepseek_v32"
    compress_ratios: tuple[int, ...] = (1,)
    kv_source_layers: tuple[int, ...] | None = None
    index_source_layers: tuple[int, ...] | None = None
    sliding_window: int | None = None
    swa_block_size: int = 64
    index_topk: int = 2048
    max_image_tokens: int = 0
    max_image_spans: int = 0
    max_prefill_workspace: int | None = None
    max_logits_bytes: int = 512 * 1024 * 1024
    dense_prefill_workspace_bytes: int = 16 * 1024 * 1024
    dcp_world_size: int = 1
    dcp_rank: int = 0
    cp_kv_cache_interleave_size: int = 1
    device: str = field(default_factory=_default_device)
    num_sms: int | None = None
    use_flattening: bool | None = None
    kernel_backend: str = "auto"
    #: The distinct layer types of ``compress_ratios`` (derived at construction).
    _types: tuple[LayerType, ...] = field(init=False, repr=False, compare=False, default=())
    #: Each layer's sources (derived at construction).
    _sources: LayerSources | None = field(init=False, repr=False, compare=False, default=None)

    def __post_init__(self) -> None:
        for name in ("compress_ratios", "kv_source_layers", "index_source_layers"):
            if getattr(self, name) is not None:
                object.__setattr__(self, name, tuple(getattr(self, name)))
        self._check_positive()
        object.__setattr__(self, "_types", self._resolve_layer_types())
        self._check_ratios()
        object.__setattr__(self, "_sources", resolve_sources(
            self.per_layer_types, self.kv_source_layers, self.index_source_layers))
        check_dcp(self)
        check_device(self.device)
        if self.max_prefill_workspace is None:
            object.__setattr__(self, "max_prefill_workspace", 40 * self.max_model_len)
        if self.num_sms is None:
            object.__setattr__(self, "num_sms", device_sm_count(self.torch_device))
        if self.use_flattening is None:
            object.__setattr__(self, "use_flattening", self.next_n not in NATIVE_NEXT_N)
        if self.kernel_backend not in ("auto", "torch", "triton"):
            raise ConfigError(f"kernel_backend={self.kernel_backend!r} is not one of 'auto', "
                              "'torch', 'triton'")
        if not self.use_flattening and self.next_n not in NATIVE_NEXT_N:
            raise ConfigError(
                f"use_flattening=False needs next_n in {NATIVE_NEXT_N} (the natively supported "
                f"query lengths), got next_n={self.next_n}"
            )
        check_bounds(self)
        check_image_capacity(self, architecture(self.architecture).image_spans)

    def _check_positive(self) -> None:
        for name in ("max_num_seqs", "max_num_batched_tokens", "max_model_len", "block_size",
                     "swa_block_size", "index_topk", "max_logits_bytes",
                     "dense_prefill_workspace_bytes", "dcp_world_size",
                     "cp_kv_cache_interleave_size"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ConfigError(f"{name}={value!r} must be a positive int")
        if self.num_speculative_tokens < 0 or self.num_speculative_tokens > 15:
            raise ConfigError(f"num_speculative_tokens={self.num_speculative_tokens} must be "
                              "in [0, 15]")
        if self.max_prefill_workspace is not None and self.max_prefill_workspace < 1:
            raise ConfigError(f"max_prefill_workspace={self.max_prefill_workspace} must be a "
                              "positive int")
        if self.num_sms is not None and self.num_sms < 1:
            raise ConfigError(f"num_sms={self.num_sms} must be a positive int")
        if self.max_logits_bytes < 4:
            raise ConfigError(f"max_logits_bytes={self.max_logits_bytes} must hold at least one "
                              "fp32 logit (4)")

    def _resolve_layer_types(self) -> tuple[LayerType, ...]:
        """The distinct layer types of ``compress_ratios``, in the table's order."""
        if not self.compress_ratios:
            raise ConfigError("compress_ratios is empty: a model has at least one layer")
        present = {t.name for t in self.per_layer_types}
        return tuple(layer_type(n) for n in LAYER_TYPES if n in present)

    def _check_ratios(self) -> None:
        for t in self._types:
            if t.compress_ratio and self.block_size % t.compress_ratio:
                raise ConfigError(
                    f"block_size={self.block_size} is not a multiple of the {t.name} compress "
                    f"ratio {t.compress_ratio}: a compressed block must hold whole entries"
                )
        dense = [t.name for t in self._types if t.reads is Reads.ALL]
        if len(dense) > 1:
            raise ConfigError(f"layer types {dense} each read every compressed entry; the SWA "
                              "builder serves one such type per model")
        if self.sliding_window is not None and self.sliding_window < 1:
            raise ConfigError(f"sliding_window={self.sliding_window} must be >= 1 or None")
        windowed = [t.name for t in self._types if t.window]
        if self.sliding_window is None and windowed:
            raise ConfigError(f"layer types {windowed} attend a sliding window: set "
                              "sliding_window")
        if self.sliding_window is not None and not windowed:
            raise ConfigError(
                f"sliding_window={self.sliding_window}, but no layer type of "
                f"{[t.name for t in self._types]} attends a window (architecture="
                f"{self.architecture!r}, compress_ratios={self.compress_ratios})"
            )

    # ----------------------------------------------------------------- derived sizes
    @property
    def torch_device(self) -> torch.device:
        dev = torch.device(self.device)
        if dev.type == "cuda" and dev.index is None:
            dev = torch.device("cuda", torch.cuda.current_device())
        return dev

    @property
    def next_n(self) -> int:
        """Query length of a uniform (MTP) decode request: ``1 + num_speculative_tokens``."""
        return 1 + self.num_speculative_tokens

    @property
    def decode_threshold(self) -> int:
        """The one decode threshold every builder and the reorder use (= ``next_n``)."""
        return self.next_n

    @property
    def layer_types(self) -> tuple[LayerType, ...]:
        """The model's distinct layer types (:data:`~staticattn.model.LAYER_TYPES` order)."""
        return self._types

    @property
    def per_layer_types(self) -> tuple[LayerType, ...]:
        """The type of every layer, in layer order."""
        family = architecture(self.architecture)
        return tuple(layer_type(family.layer_type_name(r, i))
                     for i, r in enumerate(self.compress_ratios))

    @property
    def sources(self) -> LayerSources:
        """Each layer's kv and index source (:mod:`staticattn.model.sources`)."""
        return self._sources

    @property
    def index_layer_types(self) -> tuple[LayerType, ...]:
        """The layer types whose source layers own an index-K cache, each served by its own
        indexer metadata (V4.1 has two: c1a and c2a)."""
        return tuple(t for t in self._types if Cache.INDEX_K in t.owns)

    @property
    def index_layer_type(self) -> LayerType | None:
        """The one layer type owning the indexer's K cache (None: no indexer).

        Raises :class:`ConfigError` when several do (name the type to the indexer builder).
        """
        owners = self.index_layer_types
        if len(owners) > 1:
            raise ConfigError(
                f"layer types {[t.name for t in owners]} each own an index cache: name the "
                "one an indexer serves (IndexerMetadataBuilder(layer_type=...))"
            )
        return owners[0] if owners else None

    @property
    def index_compress_ratio(self) -> int:
        """Compress ratio of the indexer's K cache: its owning type's (1 without one)."""
        return getattr(self.index_layer_type, "compress_ratio", 1)

    @property
    def dense_layer_type(self) -> LayerType | None:
        """The layer type that reads every complete compressed entry (C128A), or None."""
        return next((t for t in self._types if t.reads is Reads.ALL), None)

    @property
    def dense_width(self) -> int:
        """Width of the dense type's index rows (``maxC``): ``round_up(cdiv(max_model_len,
        R), 128)``; 0 without such a type."""
        dense = self.dense_layer_type
        return 0 if dense is None else dense.topk_width(self.index_topk, self.max_model_len)

    @property
    def storage_block_size(self) -> int:
        """Indexer-K entries per block, ``block_size // index_compress_ratio`` (one type)."""
        return self.block_size // self.index_compress_ratio

    @property
    def max_blocks_per_req(self) -> int:
        """Main block-table columns (a rank's local blocks: ``block_size * W`` tokens each)."""
        return cdiv(self.max_model_len, self.block_size * self.dcp_world_size)

    @property
    def max_swa_blocks_per_req(self) -> int:
        """Columns of the SWA block table (replicated under DCP: every token's block)."""
        return cdiv(self.max_model_len, self.swa_block_size)

    @property
    def dcp_sharded_ratios(self) -> tuple[int, ...]:
        """Compress ratios of the caches DCP shards, which the interleave must respect: every
        index-owning type's (1 without one) and the sharded types' (C4A, c1a, c2a; C128A and
        the SWA window are replicated; :mod:`staticattn.arena.dcp_rules`)."""
        index = {max(t.compress_ratio, 1) for t in self.index_layer_types} or {1}
        return tuple(sorted(index | {
            t.compress_ratio for t in self._types if t.dcp_sharded and t.compress_ratio}))

    def dcp_entry_interleave(self, compress_ratio: int) -> int:
        """The interleave at which DCP deals the entries of a cache of ``compress_ratio``
        (``R``, 0 or 1: uncompressed): ``I // R`` entries, at least 1 (entry ``c`` covers
        tokens ``[cR, (c + 1) R)``, all in interleave group ``cR // I``)."""
        return max(self.cp_kv_cache_interleave_size // max(compress_ratio, 1), 1)

    @property
    def dcp_compressed_interleave(self) -> int:
        """The interleave of the indexer's compressed entries (:meth:`dcp_entry_interleave`
        of ``index_compress_ratio``)."""
        return self.dcp_entry_interleave(self.index_compress_ratio)

    @property
    def max_decode_tokens(self) -> int:
        """Decode tokens one step can hold: each decode request has at most ``next_n``."""
        return min(self.max_num_batched_tokens, self.max_num_seqs * self.next_n)

    @property
    def has_swa(self) -> bool:
        """Whether some layer type attends a sliding window."""
        return any(t.window for t in self._types)

    @property
    def image_spans(self) -> bool:
        """Whether steps carry image spans (``max_image_tokens > 0``)."""
        return self.max_image_tokens > 0

    @property
    def bounded_replay(self) -> bool:
        """Whether prefilling requests carry a ``replay_start`` (the architecture's
        :attr:`~staticattn.model.Architecture.bounded_replay`, with a window)."""
        return self.has_swa and architecture(self.architecture).bounded_replay

    def replace(self, **changes) -> ArenaConfig:
        """A copy with some fields changed (validated again)."""
        return dataclasses.replace(self, **changes)

    # ----------------------------------------------------------------------- presets
    @classmethod
    def deepseek_v32(cls, **overrides) -> ArenaConfig:
        """The "deepseek-v3.2" preset (:data:`staticattn.model.PRESETS`) with overrides."""
        return cls.preset("deepseek-v3.2", **overrides)

    @classmethod
    def deepseek_v4(cls, **overrides) -> ArenaConfig:
        """The "deepseek-v4" preset (:data:`staticattn.model.PRESETS`) with overrides."""
        return cls.preset("deepseek-v4", **overrides)

    @classmethod
    def preset(cls, name: str, **overrides) -> ArenaConfig:
        """A named preset of :data:`staticattn.model.PRESETS` under ``overrides``."""
        return cls(**{**model_preset(name).fields, **overrides})

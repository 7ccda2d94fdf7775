"""Compressed-KV metadata of every kv-source layer type, graph-safe, in one launch per step
(``docs/spec/deepseek-v41.md`` §4-§7; ``vllm-semantics.md`` §4.5, §7).

Per step and per type owning a compressed KV cache (V4.1: ``c1a``, ``c2a``; V4: ``c4a``,
``c128a``) it writes, into arena views, the compressed slot each token writes, the compressed
entries each token may read ``n_c(p)``, and for a type with a compressor ring of its own
(V4.1's ``c2a``) each token's ring slot (:mod:`staticattn.kernels.compressed.kv_slots`). For the
top-k types it holds the decode operand a layer derives from its top-k
(:meth:`~staticattn.builders.compressed.metadata.CompressedMetadata.decode_topk`).

What differs per type is its row: the ratio ``R``, ``S = block_size // R``, the table (its
``<type>.compressed_kv`` group's under V4.1, the main one under V4) and the own-slot rule
(V4.1: a token whose staged slot is -1 writes nothing, nor does a token that bounded replay
recomputes -- ``batch.replay_start``, ``docs/spec/deepseek-v41.md`` §8.1, §11 case 4: the
staged slots are the SWA group's, which replay leaves valid; V4 keeps v0.20.2's
position-only rule, so its C4A slots equal the indexer's compressed slot mapping).

Differences from the reference, each on purpose:

* padded tokens get ring slot -1, where the reference's FULL graphs give them request 0's
  real slot from a stale position (spec §5.3; harmless there, defined here);
* rows of the top-k operand past the step's decode tokens, and of invalid tokens, are all -1
  with length 0 (the reference pre-fills -1 and relies on the indexer's -1 rows);
* V4's compressor state has no ring table of its own, so V4 types get no ring slots.

Decode context parallelism (``dcp_world_size = W > 1``) is served for types whose caches
have tables of their own (V4.1's c1a and c2a; the reference serves neither, see
:mod:`staticattn.model.layer_types`): each rank's arena holds that rank's local blocks in the
``<type>.compressed_kv`` table, and of a sharded type's entries a rank writes only those it
holds, at their local index (``docs/spec/deepseek-v41.md`` §5.1: ``p`` localised to
``p // (I W) * I + p % I`` first; :mod:`staticattn.kernels.compressed.kv_slots`). The entry
counts stay the global ``n_c(p)`` (every rank decides the short-context fill alike; the
indexers hold the local lengths), the ring slots stay every rank's (the compressor state is
replicated), and :meth:`CompressedMetadata.decode_topk` turns the merged global top-k into
the rank's local slots. V4's types, addressed through the main table, are not served under
DCP: their sharded C4A slots are the indexer builder's.
"""

from __future__ import annotations

import functools

import torch

from staticattn.arena import Arena, ArenaConfig, BufferDecl, cache_groups
from staticattn.builders.attention_utils.split import split_decodes_and_prefills
from staticattn.builders.batch import Batch
from staticattn.builders.compressed.metadata import CompressedKVMetadata, CompressedMetadata
from staticattn.builders.contract import bound_config, claim_arena
from staticattn.errors import ConfigError, InvalidBatchError
from staticattn.kernels.compressed.entry_boundary import entry_written
from staticattn.kernels.compressed.kv_slots import CompressedKVType, compressed_kv_slots
from staticattn.kernels.compressed.slot_gate import SlotGate
from staticattn.kernels.dcp.ownership import DCPShard
from staticattn.kernels.runtime.backend import resolve_backend
from staticattn.model import Addressing, Cache, LayerType, Reads
from staticattn.staging import PAD_SLOT_ID
from staticattn.validation.values import check_capacity

__all__ = ["CompressedMetadataBuilder", "compressed_served", "kv_source_types", "ring_capacity"]


def kv_source_types(config: ArenaConfig) -> tuple[LayerType, ...]:
    """The config's types whose source layers own a compressed KV cache (table order)."""
    return tuple(t for t in config.layer_types if Cache.COMPRESSED_KV in t.owns)


def compressed_served(config: ArenaConfig) -> bool:
    """Whether :class:`CompressedMetadataBuilder` serves ``config``: some type owns a
    compressed KV cache and, under decode context parallelism, every such type's cache has a
    table of its own (DeepSeek V4.1, not V4)."""
    return _unserved(config) is None


def ring_capacity(num_speculative_tokens: int) -> int:
    """Rows of a compressor ring per request: ``max(8, next_pow2(num_spec + 2))`` (spec §2.3).

    >>> ring_capacity(1), ring_capacity(7)
    (8, 16)
    """
    return max(8, 1 << (num_speculative_tokens + 1).bit_length())


def _has_ring(config: ArenaConfig, t: LayerType) -> bool:
    return any(g.layer_type == t and g.cache is Cache.COMPRESSOR_STATE
               for g in cache_groups(config))


class CompressedMetadataBuilder:
    """Builds :class:`CompressedMetadata` into the arena.

    Buffers (``compressed.<type>.*``, device; ``T = max_num_batched_tokens``,
    ``Td = max_decode_tokens``, ``K = index_topk``), per kv-source type:

    - ``slot_mapping`` int64 ``(T,)``, initially -1;
    - ``entry_counts`` int32 ``(T,)``;
    - with a ring of its own: ``ring_slot_mapping`` int64 ``(T,)``, initially -1;
    - a top-k type: ``decode_topk_indices`` int32 ``(Td, 1, K)``, initially -1, and
      ``decode_topk_lens`` int32 ``(Td,)``;
    - a type that reads every entry (C128A): ``entry_written`` int32 ``(1,)``, the
      reference's ``c128_boundary`` as a device flag (a second launch).

    One launch per build (up to three types, :data:`~staticattn.kernels.compressed.kv_slots.
    TYPES_PER_LAUNCH`), the same in :meth:`build`, :meth:`build_decode` and
    :meth:`build_mixed`: the real token count is read on the device, so padded tokens get
    -1 slots and count 0 on every path.

    Raises :class:`ConfigError` from :meth:`buffers` for a config without a kv-source type
    (DeepSeek V3.2), or under decode context parallelism with a type addressed through the
    main table (DeepSeek V4).

    Examples
    --------
    >>> from staticattn.builders import make_arena
    >>> cfg = ArenaConfig.preset("deepseek-v4.1-flash", device="cpu", max_model_len=1024,
    ...                          max_num_seqs=4, max_num_batched_tokens=64)
    >>> builder = CompressedMetadataBuilder()
    >>> arena, inputs = make_arena(cfg, [builder])
    >>> inputs.block_tables["c2a.compressed_kv"][0, 0] = 11
    >>> inputs.block_tables["c2a.compressor_state"][0, 0] = 1
    >>> counts = inputs.stage([4], [4], [0, 1, 2, 3])
    >>> inputs.copy_to_device(1, 4)
    >>> meta = builder.build(Batch.from_staged(inputs, counts))
    >>> c2a = meta.types["c2a"]
    >>> c2a.slot_mapping.tolist(), c2a.entry_counts.tolist(), c2a.ring_slot_mapping.tolist()
    ([-1, 352, -1, 353], [0, 1, 1, 2], [8, 9, 10, 11])
    """

    name = "compressed"

    def __init__(self) -> None:
        self.config: ArenaConfig | None = None
        self.types: tuple[LayerType, ...] = ()

    # ------------------------------------------------------------------ contract
    def buffers(self, config: ArenaConfig) -> list[BufferDecl]:
        """The ``compressed.<type>.*`` declarations (listed in the class docstring)."""
        t, td, k = config.max_num_batched_tokens, config.max_decode_tokens, config.index_topk
        decls = []
        for ty in _served_types(config):
            name = f"compressed.{ty.name}"
            decls += [BufferDecl(f"{name}.slot_mapping", (t,), torch.int64, fill=PAD_SLOT_ID),
                      BufferDecl(f"{name}.entry_counts", (t,), torch.int32)]
            if _has_ring(config, ty):
                decls.append(BufferDecl(f"{name}.ring_slot_mapping", (t,), torch.int64,
                                        fill=PAD_SLOT_ID))
            if ty.reads is Reads.TOPK:
                decls += [BufferDecl(f"{name}.decode_topk_indices", (td, 1, k), torch.int32,
                                     fill=-1),
                          BufferDecl(f"{name}.decode_topk_lens", (td,), torch.int32)]
            if ty.reads is Reads.ALL:
                decls.append(BufferDecl(f"{name}.entry_written", (1,), torch.int32))
        return decls

    def bind(self, arena: Arena) -> None:
        """Take the ``compressed.*`` views of an allocated arena."""
        cfg = arena.config
        self.types = _served_types(cfg)
        claim_arena(self, arena)
        self.config = cfg
        self.backend = resolve_backend(cfg.kernel_backend, arena.device)
        self._ring_capacity = ring_capacity(cfg.num_speculative_tokens)
        # The token shard the slot kernel localises positions with (None without DCP).
        self._dcp = (DCPShard(cfg.dcp_world_size, cfg.dcp_rank, cfg.cp_kv_cache_interleave_size)
                     if cfg.dcp_world_size > 1 else None)

        def view(ty: LayerType, what: str) -> torch.Tensor | None:
            key = f"compressed.{ty.name}.{what}"
            return arena[key] if key in arena else None

        self._views = {ty.name: {w: view(ty, w) for w in (
            "slot_mapping", "entry_counts", "ring_slot_mapping", "decode_topk_indices",
            "decode_topk_lens", "entry_written")} for ty in self.types}
        # Views cut once per extent and kept, per binding.
        self._cut = functools.lru_cache(maxsize=4096)(self._cut_views)

    def build(self, batch: Batch) -> CompressedMetadata:
        """Metadata for any batch (decodes first), eager; reads the host query starts for
        the decode/prefill split only."""
        cfg = bound_config(self)
        self._check_batch(batch)
        _, _, td, _ = split_decodes_and_prefills(batch, decode_threshold=cfg.decode_threshold)
        return self._build(batch, td, None)

    def build_decode(self, batch: Batch) -> CompressedMetadata:
        """Graph-safe metadata for :meth:`Batch.for_decode_capture` (``num_reqs`` requests of
        ``next_n`` tokens; trailing requests may be padding): one launch, fixed views."""
        cfg = bound_config(self)
        self._check_batch(batch)
        if batch.num_actual_tokens != batch.num_reqs * cfg.next_n:
            raise InvalidBatchError(
                f"build_decode needs a uniform decode batch of {batch.num_reqs} x next_n="
                f"{cfg.next_n} tokens, got {batch.num_actual_tokens}; build it with "
                "Batch.for_decode_capture"
            )
        return self._build(batch, batch.num_actual_tokens, None)

    def build_mixed(self, batch: Batch) -> CompressedMetadata:
        """Graph-safe metadata for a step of any composition within a token bucket
        (:meth:`Batch.for_mixed_capture`): every per-token view covers the bucket's ``T``
        tokens (-1 / 0 past the real ones); the decode operand covers
        ``min(T, max_decode_tokens)`` rows, those past the real decode tokens
        (``step_counts``) invalid. One launch."""
        cfg = bound_config(self)
        self._check_batch(batch)
        counts = batch.require_step_counts()
        rows = min(batch.num_actual_tokens, cfg.max_decode_tokens)
        return self._build(batch, rows, counts)

    # ------------------------------------------------------------------ helpers
    def _build(self, batch: Batch, decode_rows: int,
               step_counts: torch.Tensor | None) -> CompressedMetadata:
        num_tokens = batch.num_actual_tokens
        views = self._cut(num_tokens, decode_rows)
        tables = {ty.name: batch.table_of(ty, Cache.COMPRESSED_KV) for ty in self.types}
        rings = {ty.name: batch.table_of(ty, Cache.COMPRESSOR_STATE) for ty in self.types
                 if views[ty.name]["ring_slot_mapping"] is not None}
        compressed_kv_slots(
            self.backend, batch.query_start_loc, batch.positions, batch.token_to_req,
            SlotGate(batch.slot_mapping, batch.replay_start, self.config.sliding_window or 0),
            [self._kernel_type(ty, tables, rings) for ty in self.types],
            num_reqs=batch.num_reqs, num_tokens=num_tokens, dcp=self._dcp,
        )
        for ty in self.types:
            flag = views[ty.name]["entry_written"]
            if flag is not None:
                entry_written(self.backend, views[ty.name]["slot_mapping"], flag,
                              num_tokens=num_tokens)
        per_type = {
            ty.name: CompressedKVMetadata(
                layer_type=ty.name, compress_ratio=max(ty.compress_ratio, 1),
                entries_per_block=ty.entries_per_block(self.config.block_size),
                block_table=tables[ty.name], ring_capacity=(
                    self._ring_capacity if ty.name in rings else 0),
                dcp=self._entry_shard(ty), **views[ty.name])
            for ty in self.types
        }
        return CompressedMetadata(per_type, batch.token_to_req, batch.slot_mapping,
                                  decode_rows, step_counts, self.backend)

    def _kernel_type(self, ty: LayerType, tables, rings) -> CompressedKVType:
        whole = self._views[ty.name]
        ring = rings.get(ty.name)
        return CompressedKVType(
            tables[ty.name], max(ty.compress_ratio, 1),
            ty.entries_per_block(self.config.block_size), ty.own_slot_gate,
            whole["slot_mapping"], whole["entry_counts"], ring, self._ring_capacity,
            whole["ring_slot_mapping"], ty.dcp_sharded,
        )

    def _entry_shard(self, ty: LayerType) -> DCPShard | None:
        """This rank's shard of ``ty``'s entries (interleave ``I // R``), None when they are
        not dealt over ranks."""
        if self._dcp is None or not ty.dcp_sharded:
            return None
        world, rank, _ = self._dcp
        return DCPShard(world, rank, bound_config(self).dcp_entry_interleave(ty.compress_ratio))

    def _cut_views(self, num_tokens: int, decode_rows: int) -> dict[str, dict]:
        """Per type, its views cut to ``num_tokens`` tokens and ``decode_rows`` rows."""
        def cut(view: torch.Tensor | None, n: int) -> torch.Tensor | None:
            return None if view is None else view[:n]

        return {name: dict(
            slot_mapping=cut(v["slot_mapping"], num_tokens),
            entry_counts=cut(v["entry_counts"], num_tokens),
            ring_slot_mapping=cut(v["ring_slot_mapping"], num_tokens),
            decode_topk_indices=cut(v["decode_topk_indices"], decode_rows),
            decode_topk_lens=cut(v["decode_topk_lens"], decode_rows),
            entry_written=v["entry_written"],
        ) for name, v in self._views.items()}

    def _check_batch(self, batch: Batch) -> None:
        """Static checks only (presence, capacities): nothing here reads data."""
        if batch.positions is None or batch.token_to_req is None:
            raise InvalidBatchError(
                "the compressed builder reads the staged positions and token_to_req views; "
                "build the batch with Batch.from_inputs / Batch.from_staged"
            )
        check_capacity(batch.num_reqs, batch.num_actual_tokens, self.config)


def _unserved(config: ArenaConfig) -> str | None:
    """Why the builder does not serve ``config`` (:func:`compressed_served`); None if it does."""
    types = kv_source_types(config)
    if not types:
        return (f"no layer type of {[t.name for t in config.layer_types]} owns a compressed "
                "KV cache: the compressed builder serves DeepSeek V4 and V4.1 models")
    main = [t.name for t in types if t.addressing is Addressing.MAIN_TABLE]
    if config.dcp_world_size > 1 and main:
        return ("the compressed builder does not serve decode context parallelism "
                f"(dcp_world_size={config.dcp_world_size}) for layer types {main}, addressed "
                "through the main block table; the indexer builder holds their sharded "
                "compressed slots")
    return None


def _served_types(config: ArenaConfig) -> tuple[LayerType, ...]:
    why = _unserved(config)
    if why is not None:
        raise ConfigError(why)
    return kv_source_types(config)

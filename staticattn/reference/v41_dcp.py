"""Oracle of one rank's DeepSeek V4.1 metadata under decode context parallelism, written as
plain loops from the spec's words (``docs/spec/deepseek-v41.md`` §5.1-§5.2, §7.1;
``vllm-0.33-delta.md`` §4.1) and nothing of staticattn's kernels.

The layout, restated: position ``p`` lives on rank ``(p // I) % W``; a compressed entry of
ratio ``R`` lives where the token completing it lives (``I`` a multiple of ``R``, so every
token of the entry is on that rank); a rank keeps the entries it holds in order, an entry's
local index being the count of entries before it that the same rank holds
(:mod:`staticattn.reference.dcp_indexer`). Each rank has its own table per cache group
(``V41Step.tables`` of that rank), addressing local indices ``S`` to a page.

Per rank:

* the compressed KV and index-K slot of a token: the V4.1 rule (``(p + 1) % R == 0`` and its
  own slot, after replay, not -1) and, besides, the entry is this rank's: at its local index
  through this rank's table; else -1;
* the entry counts ``n_c(p)`` and the compressor-ring slots: as on one GPU (staticattn keeps
  the counts global and the rings replicated);
* the decode operand from the merged global top-k: the entries this rank holds, at their
  local slots; the others -1, not counted;
* each indexer: the V4 DCP oracle on the type's view (local decode lengths after the
  per-token expansion, the schedule of them, local prefill bounds), its slot mapping
  replaced by the gated per-rank one.
"""

from __future__ import annotations

from staticattn.reference import dcp_indexer
from staticattn.reference import v41_compressed as single
from staticattn.reference.v41_compressed import RATIOS, V41Step

__all__ = ["compressed", "global_topk", "index_k_slots", "indexer_metadata", "mixed_indexer",
           "rank_slots"]


def rank_slots(cfg, v41: V41Step, group: str, ratio: int, rank: int, num_reqs: int,
               num_tokens: int) -> list[int]:
    """§5.1-§5.2 on ``rank``: the single-GPU rule (:func:`single.compressed_slots`) through
    ``group``'s table, with the token completing entry ``k = p // R`` gated off (own slot -1)
    unless ``k`` is this rank's, and its position localised to ``j R + p % R``, ``j`` being
    ``k``'s local index."""
    world, interleave = cfg.dcp_world_size, cfg.cp_kv_cache_interleave_size
    owner, position, _ = single.tokens(v41.step)
    own = single.group_own_slots(v41, cfg.sliding_window)
    own = [s if dcp_indexer.owner_of_entry(p // ratio, ratio, world, interleave) == rank else -1
           for s, p in zip(own, position)]
    local = dcp_indexer.local_counter(ratio, world, rank, interleave)
    localised = [local(p // ratio) * ratio + p % ratio for p in position]
    return single.compressed_slots(ratio, cfg.block_size // ratio, v41.rows(group, num_reqs),
                                   owner, localised, own, num_tokens)


def compressed(cfg, v41: V41Step, rank: int, num_reqs: int, num_tokens: int) -> dict:
    """Per kv-source type, rank ``rank``'s ``slot_mapping``, ``entry_counts`` and (c2a)
    ``ring_slot_mapping`` over ``num_tokens`` tokens of ``num_reqs`` requests; ``v41``
    carries this rank's tables."""
    owner, position, _ = single.tokens(v41.step)
    out = {}
    for name, ratio in RATIOS.items():
        out[name] = dict(
            slot_mapping=rank_slots(cfg, v41, f"{name}.compressed_kv", ratio, rank, num_reqs,
                                    num_tokens),
            entry_counts=single.entry_counts(ratio, position, num_tokens))
        ring = f"{name}.compressor_state"
        if ring in v41.tables:
            out[name]["ring_slot_mapping"] = single.ring_slots(
                v41.rows(ring, num_reqs), single.ring_capacity(cfg.num_speculative_tokens),
                owner, position, num_tokens)
    return out


def index_k_slots(cfg, v41: V41Step, name: str, rank: int, num_reqs: int,
                  num_tokens: int) -> list[int]:
    """§5.2 on ``rank``: the index-K slot mapping of type ``name``."""
    return rank_slots(cfg, v41, f"{name}.index_k", RATIOS[name], rank, num_reqs, num_tokens)


def global_topk(cfg, name: str, rank: int, topk_rows, owner, valid, table):
    """§7.1 on ``rank``: the single-GPU operand (:func:`single.global_topk`) of each row's
    global entry ids ``k >= 0`` this rank holds, as their local indices ``j`` (at
    ``bt[b, j // S] * S + j % S``); every other one -1, not counted; an invalid token: a row
    of -1, length 0."""
    ratio = RATIOS[name]
    world, interleave = cfg.dcp_world_size, cfg.cp_kv_cache_interleave_size
    local = dcp_indexer.local_counter(ratio, world, rank, interleave)
    held = [[local(k) if k >= 0 and dcp_indexer.owner_of_entry(k, ratio, world, interleave)
             == rank else -1 for k in row] for row in topk_rows]
    return single.global_topk(held, owner, valid, table, cfg.block_size // ratio)


def indexer_metadata(cfg, v41: V41Step, name: str, rank: int, *, graph: bool = False) -> dict:
    """Every field of rank ``rank``'s ``IndexerMetadataBuilder(name).build`` (``graph``:
    ``build_decode``)."""
    view, step = single.type_view(cfg, v41, name)
    want = dcp_indexer.indexer_metadata(view, step, rank, graph=graph)
    want["slot_mapping"] = index_k_slots(cfg, v41, name, rank, step.num_reqs_padded,
                                         step.num_tokens_padded)
    return want


def mixed_indexer(cfg, v41: V41Step, name: str, rank: int, num_reqs: int, num_tokens: int,
                  chunk_rows: int) -> dict:
    """Every field of rank ``rank``'s ``IndexerMetadataBuilder(name).build_mixed`` for a
    bucket."""
    view, step = single.type_view(cfg, v41, name)
    want = dcp_indexer.mixed_indexer(view, step, rank, num_reqs, num_tokens, chunk_rows)
    want["slot_mapping"] = index_k_slots(cfg, v41, name, rank, num_reqs, num_tokens)
    return want

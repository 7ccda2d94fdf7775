"""Oracle of the compressed-KV builder for any config, one kv-source type at a time, read
from the type's row: DeepSeek V4.1's ``c1a`` / ``c2a`` (their groups' tables, the own-slot
rule, ``c2a``'s ring) and V4's ``c4a`` / ``c128a`` (the main table, position only, no ring);
under decode context parallelism a sharded V4.1 type's slots are the rank's
(:func:`staticattn.reference.v41_dcp.rank_slots`).

The formulas are :mod:`staticattn.reference.v41_compressed`'s (spec §5-§6); this module
only picks, per row, which table and which rule they apply to. Used by the checks that
compare a step's builds with the reference (:mod:`staticattn.checks.reference_check`).
"""

from __future__ import annotations

from staticattn.model import Addressing, Cache, LayerType
from staticattn.reference import v41_compressed as formulas
from staticattn.reference import v41_dcp
from staticattn.reference.assertions import same

__all__ = ["assert_matches", "expected"]


def expected(cfg, step, tables: dict, types: list[LayerType], num_reqs: int,
             num_tokens: int) -> dict[str, dict[str, list[int]]]:
    """Per type: ``slot_mapping``, ``entry_counts`` and, with a ring of its own,
    ``ring_slot_mapping`` over ``num_tokens`` tokens of ``num_reqs`` requests.

    ``step``: a :class:`~staticattn.reference.step.HostStep` (its ``block_table`` is the
    main one); ``tables``: the cache groups' host tables by group name
    (``"c2a.compressed_kv"``; empty for V4)."""
    owner, position, own = formulas.tokens(step)
    out = {}
    for t in types:
        ratio, per = t.compress_ratio, t.entries_per_block(cfg.block_size)
        own_groups = t.addressing is Addressing.OWN_GROUPS
        table = tables[t.group(Cache.COMPRESSED_KV)] if own_groups else step.block_table
        if own_groups and t.dcp_sharded and cfg.dcp_world_size > 1:
            slots = v41_dcp.rank_slots(cfg, formulas.V41Step(step, tables),
                                       t.group(Cache.COMPRESSED_KV), ratio, cfg.dcp_rank,
                                       num_reqs, num_tokens)
        else:
            slots = formulas.compressed_slots(ratio, per, formulas.padded_rows(table, num_reqs),
                                              owner, position, own, num_tokens,
                                              gate=t.own_slot_gate)
        want = dict(slot_mapping=slots,
                    entry_counts=formulas.entry_counts(ratio, position, num_tokens))
        ring = t.group(Cache.COMPRESSOR_STATE)
        if own_groups and ring in tables:
            want["ring_slot_mapping"] = formulas.ring_slots(
                formulas.padded_rows(tables[ring], num_reqs),
                formulas.ring_capacity(cfg.num_speculative_tokens), owner, position,
                num_tokens)
        out[t.name] = want
    return out


def assert_matches(meta, want: dict) -> None:
    """Every type's fields of ``meta`` (a ``CompressedMetadata``) equal ``want``
    (:func:`expected`); :class:`~staticattn.reference.assertions.ReferenceMismatch` naming the
    type and field otherwise."""
    same("types", list(meta.types), list(want))
    for name, fields in want.items():
        kv = meta.types[name]
        for field, values in fields.items():
            same(f"{name}.{field}", getattr(kv, field), values)
        if "ring_slot_mapping" not in fields:
            same(f"{name}.ring_slot_mapping", kv.ring_slot_mapping, None)

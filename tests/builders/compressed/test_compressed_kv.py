"""The compressed-KV builder beyond DeepSeek V4.1's examples: cache groups and arenas as data
(V3.2 and V4 arenas unchanged), the builder on V4's types with V4's rules (no own-slot gate,
the main table, no ring), the fused kernel over more types than one launch serves, and the
typed errors."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from helpers.support import DEVICE, host_steps, make_step, stage
from helpers.v41_steps import v41_config
from hypothesis import given, settings

from staticattn.arena import ArenaConfig, cache_groups
from staticattn.builders import (
    CompressedMetadataBuilder,
    IndexerMetadataBuilder,
    default_builders,
    make_arena,
)
from staticattn.errors import ConfigError, InvalidBatchError
from staticattn.kernels.compressed.kv_slots import CompressedKVType, compressed_kv_slots
from staticattn.kernels.compressed.slot_gate import SlotGate
from staticattn.model import Addressing, Cache, layer_type
from staticattn.reference import compressor
from staticattn.reference import v41_compressed as oracle

SMALL = dict(max_num_seqs=8, max_num_batched_tokens=256, max_model_len=4096, num_sms=8,
             device=DEVICE)


def test_group_tables_are_data_of_the_rows():
    assert layer_type("c2a").addressing is Addressing.OWN_GROUPS
    assert layer_type("c2a").own_slot_gate and not layer_type("c4a").own_slot_gate
    assert layer_type("c4a").addressing is Addressing.MAIN_TABLE
    cfg = v41_config("flash-n2", "torch")
    groups = {g.name: g.columns for g in cache_groups(cfg)}
    # max_model_len 4096 over 64-token blocks; the ring one column.
    assert groups == {"c1a.compressed_kv": 64, "c1a.index_k": 64, "c2a.compressed_kv": 64,
                      "c2a.index_k": 64, "c2a.compressor_state": 1}
    arena, inputs = make_arena(cfg, default_builders(cfg))
    for name, columns in groups.items():
        assert inputs.block_tables[name].shape == (cfg.max_num_seqs, columns)
        assert inputs.block_tables[name].data_ptr() == (
            arena[f"input.block_tables.{name}"].data_ptr())
    names = arena.names()
    for prefix in ("indexer.c1a", "indexer.c2a"):
        assert f"{prefix}.compressed_slot_mapping" in names
        assert arena[f"{prefix}.expanded_block_table"].shape == (cfg.max_decode_tokens, 64)
    assert arena["compressed.c1a.decode_topk_indices"].shape == (cfg.max_decode_tokens, 1, 512)
    assert "compressed.c2a.ring_slot_mapping" in names
    assert "compressed.c1a.ring_slot_mapping" not in names


@pytest.mark.parametrize("preset", ["deepseek-v3.2", "deepseek-v4"])
def test_v32_and_v4_arenas_keep_their_buffers(preset):
    cfg = ArenaConfig.preset(preset, **SMALL)
    assert cache_groups(cfg) == ()
    builders = [IndexerMetadataBuilder()]
    arena, inputs = make_arena(cfg, builders)
    assert inputs.block_tables == {}
    assert builders[0].name == "indexer"
    assert "indexer.decode_seq_lens" in arena
    assert not any("block_tables" in name for name in arena.names())
    expected = ["indexer"] + (["compressed", "swa"] if preset == "deepseek-v4" else [])
    assert [b.name for b in default_builders(cfg)] == expected


def test_typed_errors():
    v41 = v41_config("flash-n2", "torch")
    with pytest.raises(ConfigError, match="layer_type=..."):
        make_arena(v41, [IndexerMetadataBuilder()])
    with pytest.raises(ConfigError, match="'c4a' owns no index cache"):
        make_arena(v41, [IndexerMetadataBuilder("c4a")])
    with pytest.raises(ConfigError, match="owns a compressed KV"):
        make_arena(ArenaConfig.deepseek_v32(**SMALL), [CompressedMetadataBuilder()])
    dcp = ArenaConfig.deepseek_v4(**SMALL, dcp_world_size=2, cp_kv_cache_interleave_size=4)
    with pytest.raises(ConfigError, match="decode context parallelism"):
        make_arena(dcp, [CompressedMetadataBuilder()])
    assert [b.name for b in default_builders(dcp)] == ["indexer", "swa"]
    builder = CompressedMetadataBuilder()
    _, inputs = make_arena(v41, [builder])
    step = make_step(v41, [2], [10])
    meta = builder.build(stage(inputs, step))
    with pytest.raises(InvalidBatchError, match="not a top-k kv-source type"):
        meta.decode_topk("swaonly", torch.zeros(2, v41.index_topk, dtype=torch.int32))
    with pytest.raises(InvalidBatchError, match="topk_indices must be"):
        meta.decode_topk("c1a", torch.zeros(2, 8, dtype=torch.int32))


def test_v4_types_keep_v4_rules(backend):
    """C4A and C128A through the main table, position-only (a slot -1 token still writes):
    C4A's slots are the indexer's compressed slots; no ring."""
    cfg = ArenaConfig.deepseek_v4(**SMALL, kernel_backend=backend)
    indexer, compressed = IndexerMetadataBuilder(), CompressedMetadataBuilder()
    _, inputs = make_arena(cfg, [indexer, compressed])

    @settings(max_examples=20 if backend == "torch" else 6)
    @given(host_steps(cfg, max_seq_len=4096))
    def check(step):
        batch = stage(inputs, step)
        meta = compressed.build(batch)
        assert list(meta.types) == ["c4a", "c128a"]
        owner, position, own = oracle.tokens(step)
        r, nt = step.num_reqs_padded, step.num_tokens_padded
        table = [list(map(int, row)) for row in step.block_table]
        for name in ("c4a", "c128a"):
            kv = meta.types[name]
            ratio = layer_type(name).compress_ratio
            want = oracle.compressed_slots(ratio, cfg.block_size // ratio, table, owner,
                                           position, own, nt, gate=False)
            assert kv.slot_mapping.tolist() == want
            assert kv.entry_counts.tolist() == oracle.entry_counts(ratio, position, nt)
            assert kv.ring_slot_mapping is None and kv.ring_capacity == 0
        assert meta.types["c128a"].decode_topk_indices is None
        # c128_boundary, a device flag: a request's new tokens complete a dense entry.
        assert meta.types["c4a"].entry_written is None
        want_flag = compressor.c128_boundary(step.query_lens, step.seq_lens)
        assert meta.types["c128a"].entry_written.tolist() == [int(want_flag)]
        assert (meta.types["c4a"].slot_mapping.tolist()
                == indexer.build(batch).slot_mapping.tolist())
        assert r >= step.num_reqs

    check()


@pytest.mark.parametrize("query_lens,seq_lens,want", [
    ([3], [300], 0), ([200], [300], 1), ([1, 1], [128, 5], 1), ([1, 2], [127, 257], 1),
    ([1, 2], [127, 258], 0)])
def test_the_c128_boundary_flag(backend, query_lens, seq_lens, want):
    """§4.3's ``c128_boundary`` as a device flag, the same from every build, padding
    included; a -1 slot token still completes its entry (V4: no own-slot gate)."""
    cfg = ArenaConfig.deepseek_v4(**SMALL, kernel_backend=backend)
    compressed = CompressedMetadataBuilder()
    _, inputs = make_arena(cfg, [compressed])
    assert compressor.c128_boundary(query_lens, seq_lens) == bool(want)
    step = make_step(cfg, query_lens, seq_lens, invalid_tokens=(0,))
    batch = stage(inputs, step)
    assert compressed.build(batch).types["c128a"].entry_written.tolist() == [want]


def test_one_kernel_serves_any_number_of_types(backend):
    """Four types, more than one launch holds: every type's slots, counts and ring slots
    equal the oracle's, the gate applied to the gated ones only."""
    rng = np.random.default_rng(7)
    query_lens, seq_lens = [3, 1, 9], [40, 17, 9]
    owner, position, own = oracle.tokens(make_step(
        ArenaConfig.deepseek_v4(**SMALL), query_lens, seq_lens, invalid_tokens=(1, 6)))
    nt, pad = len(owner), 4
    dev = torch.device(DEVICE)
    qsl = torch.tensor([0, 3, 4, 13, 13], dtype=torch.int32, device=dev)
    pos = torch.tensor(position + [0] * pad, device=dev)
    req = torch.tensor(owner + [0] * pad, dtype=torch.int32, device=dev)
    slots = torch.tensor(own + [-1] * pad, device=dev)
    specs = [(1, 16, True, True), (2, 8, True, False), (4, 4, False, True), (8, 2, False, False)]
    types, tables, rings = [], [], []
    for ratio, entries, gate, ring in specs:
        table = rng.integers(1, 1000, size=(4, 8), dtype=np.int32)
        ring_table = rng.integers(0, 3, size=(4, 1), dtype=np.int32)
        tables.append(table.tolist())
        rings.append(ring_table.tolist())
        types.append(CompressedKVType(
            torch.from_numpy(table).to(dev), ratio, entries, gate,
            torch.full((nt + pad,), 7, dtype=torch.int64, device=dev),
            torch.full((nt + pad,), 7, dtype=torch.int32, device=dev),
            torch.from_numpy(ring_table).to(dev) if ring else None, 8,
            torch.full((nt + pad,), 7, dtype=torch.int64, device=dev) if ring else None))
    compressed_kv_slots(backend, qsl, pos, req, SlotGate(slots), types, num_reqs=4,
                        num_tokens=nt + pad)
    for ty, table, ring_table, (ratio, entries, gate, ring) in zip(types, tables, rings, specs):
        assert ty.slots_out.tolist() == oracle.compressed_slots(
            ratio, entries, table, owner, position, own, nt + pad, gate=gate)
        assert ty.counts_out.tolist() == oracle.entry_counts(ratio, position, nt + pad)
        if ring:
            assert ty.ring_out.tolist() == oracle.ring_slots(ring_table, 8, owner, position,
                                                             nt + pad)


def test_ring_capacity_follows_the_draft_tokens():
    assert [oracle.ring_capacity(n) for n in (0, 1, 6, 7, 14)] == [8, 8, 8, 16, 16]
    from staticattn.builders.compressed import ring_capacity

    assert [ring_capacity(n) for n in (0, 1, 6, 7, 14)] == [8, 8, 8, 16, 16]


def test_batch_without_the_group_table_is_a_typed_error():
    cfg = v41_config("flash-n2", "torch")
    builder = CompressedMetadataBuilder()
    _, inputs = make_arena(cfg, [builder])
    batch = stage(inputs, make_step(cfg, [2], [10]))
    batch.block_tables = {}
    with pytest.raises(InvalidBatchError, match="c1a.compressed_kv"):
        builder.build(batch)
    assert Cache.COMPRESSED_KV in layer_type("c1a").owns

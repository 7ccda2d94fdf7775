"""The worked examples of DeepSeek V4.1 under decode context parallelism, as the docstrings
give them (``kernels/compressed/kv_slots.py``, ``kernels/compressed/topk_operand.py``), on
every rank of two and both kernel backends."""

from __future__ import annotations

import pytest
import torch
from helpers.support import DEVICE

from staticattn.arena import ArenaConfig
from staticattn.builders import Batch, CompressedMetadataBuilder, make_arena


def _rank(backend: str, rank: int):
    cfg = ArenaConfig.preset("deepseek-v4.1-flash", max_num_seqs=4, max_num_batched_tokens=16,
                             max_model_len=256, block_size=8, index_topk=8, num_sms=4,
                             dcp_world_size=2, dcp_rank=rank, cp_kv_cache_interleave_size=2,
                             device=DEVICE, kernel_backend=backend)
    builder = CompressedMetadataBuilder()
    _, inputs = make_arena(cfg, [builder])
    return builder, inputs


@pytest.mark.parametrize(("rank", "want"), [(0, [-1, 28, -1, -1, -1, 29, -1, -1]),
                                            (1, [-1, -1, -1, 28, -1, -1, -1, 29])])
def test_only_the_owner_writes_at_the_localised_position(backend, rank, want):
    """c2a, ``W = 2``, ``I = 2``, ``S = 4``, table row ``[7]``: positions 1, 3, 5, 7
    complete entries 0..3, owned by ranks 0, 1, 0, 1 (their tokens' ranks); the counts stay
    global."""
    builder, inputs = _rank(backend, rank)
    inputs.block_tables["c2a.compressed_kv"][0, 0] = 7
    counts = inputs.stage([8], [8], list(range(8)))
    inputs.copy_to_device(1, 8)
    c2a = builder.build(Batch.from_staged(inputs, counts)).types["c2a"]
    assert c2a.slot_mapping.tolist() == want
    assert c2a.entry_counts.tolist() == [0, 1, 1, 2, 2, 3, 3, 4]


@pytest.mark.parametrize(("rank", "want"), [(0, [20, -1, 21, -1, -1]),
                                            (1, [-1, 20, -1, 21, -1])])
def test_the_decode_operand_is_the_rank_s_share_of_the_merged_topk(backend, rank, want):
    """World 2, c2a (``J = I // R = 1``, ``S = 4``), table row ``[5]``, merged row
    ``[0, 1, 2, 3, -1, ...]``: each rank its entries at their local slots, length 2."""
    builder, inputs = _rank(backend, rank)
    inputs.block_tables["c2a.compressed_kv"][0, 0] = 5
    counts = inputs.stage([1], [9], [8])
    inputs.copy_to_device(1, 1)
    meta = builder.build(Batch.from_staged(inputs, counts))
    row = torch.tensor([[0, 1, 2, 3, -1, -1, -1, -1]], dtype=torch.int32, device=DEVICE)
    indices, lens = meta.decode_topk("c2a", row)
    assert indices[0, 0, :5].tolist() == want and lens.tolist() == [2]


def test_flashinfer_rows_of_a_sharded_type_are_refused_under_dcp():
    """A sharded top-k type's FlashInfer rows would address request-local top-k entries
    through one table: a typed error under DCP, before anything is written; its SWA-only
    layers' rows are built."""
    from staticattn.builders import SparseSWAMetadataBuilder
    from staticattn.errors import InvalidBatchError

    cfg = ArenaConfig.preset("deepseek-v4.1-flash", max_num_seqs=4, max_num_batched_tokens=16,
                             max_model_len=256, block_size=8, index_topk=8, num_sms=4,
                             dcp_world_size=2, dcp_rank=1, cp_kv_cache_interleave_size=2,
                             device=DEVICE, kernel_backend="torch")
    swa = SparseSWAMetadataBuilder()
    _, inputs = make_arena(cfg, [swa])
    counts = inputs.stage([1], [9], [8])
    inputs.copy_to_device(1, 1)
    meta = swa.build(Batch.from_staged(inputs, counts))
    topk = torch.zeros(1, 8, dtype=torch.int32, device=DEVICE)
    with pytest.raises(InvalidBatchError, match="not built under decode context parallelism"):
        swa.flashinfer_rows(meta, "c2a", topk, compressed_block_table=inputs.block_table)
    rows, lens = swa.flashinfer_rows(meta, "swaonly")
    assert lens.tolist() == [cfg.sliding_window]

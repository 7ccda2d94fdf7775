"""The decode-context-parallel fields of ArenaConfig: validated at construction, and what
they change in the derived sizes."""

from __future__ import annotations

import pytest

from staticattn.arena import ArenaConfig
from staticattn.errors import ConfigError

V4 = dict(device="cpu", max_model_len=4096, max_num_seqs=8, max_num_batched_tokens=256)


@pytest.mark.parametrize(("fields", "match"), [
    (dict(dcp_world_size=0), "dcp_world_size=0 must be a positive int"),
    (dict(dcp_world_size=2, dcp_rank=2), r"dcp_rank=2 is outside \[0, dcp_world_size=2\)"),
    (dict(dcp_rank=-1), r"dcp_rank=-1 is outside"),
    (dict(dcp_world_size=2, cp_kv_cache_interleave_size=0), "interleave_size=0 must be"),
    (dict(dcp_world_size=2, cp_kv_cache_interleave_size=2), "multiple of the sharded "
     "compress ratio 4"),
    (dict(dcp_world_size=2, cp_kv_cache_interleave_size=512), "does not divide block_size"),
])
def test_bad_dcp_fields_are_config_errors(fields, match):
    with pytest.raises(ConfigError, match=match):
        ArenaConfig.deepseek_v4(**V4, **fields)


def test_the_dense_type_is_replicated_so_the_interleave_need_not_respect_128():
    cfg = ArenaConfig.deepseek_v4(**V4, dcp_world_size=4, dcp_rank=3,
                                  cp_kv_cache_interleave_size=4)
    assert cfg.dcp_sharded_ratios == (4,)
    assert cfg.dcp_compressed_interleave == 1


def test_one_rank_ignores_the_interleave():
    """An interleave that W > 1 would refuse (2 is no multiple of ratio 4) is accepted on
    one rank, and changes none of the single-GPU sizes."""
    plain = ArenaConfig.deepseek_v4(**V4)
    cfg = ArenaConfig.deepseek_v4(**V4, cp_kv_cache_interleave_size=2)
    assert cfg.max_blocks_per_req == plain.max_blocks_per_req
    assert cfg.max_swa_blocks_per_req == plain.max_swa_blocks_per_req


def test_main_table_is_sharded_swa_table_is_not():
    one = ArenaConfig.deepseek_v4(**V4)
    two = ArenaConfig.deepseek_v4(**V4, dcp_world_size=2, cp_kv_cache_interleave_size=64)
    assert two.max_blocks_per_req == one.max_blocks_per_req // 2
    assert two.max_swa_blocks_per_req == one.max_swa_blocks_per_req


def test_step_fingerprint_tells_configs_and_steps_apart():
    """The cross-rank check's fingerprint: the rank and the device may differ across ranks;
    any other config field, or the step, changes it; mismatched arrays are refused."""
    import numpy as np

    from staticattn.errors import InvalidBatchError
    from staticattn.validation.dcp_step import FINGERPRINT_FIELDS, step_fingerprint

    base = dict(**V4, dcp_world_size=2, cp_kv_cache_interleave_size=4)
    q, s = np.array([2, 1, 40]), np.array([9, 30, 40])
    r0 = step_fingerprint(ArenaConfig.deepseek_v4(**base), q, s)
    r1 = step_fingerprint(ArenaConfig.deepseek_v4(**{**base, "dcp_rank": 1,
                                                     "device": "cpu:1"}), q, s)
    rank = FINGERPRINT_FIELDS.index("dcp_rank")
    assert list(np.delete(r0, rank)) == list(np.delete(r1, rank)) and r1[rank] == 1
    config = FINGERPRINT_FIELDS.index("config_checksum")
    other = step_fingerprint(ArenaConfig.deepseek_v4(**{**base, "max_num_seqs": 9}), q, s)
    assert other[config] != r0[config]
    moved = step_fingerprint(ArenaConfig.deepseek_v4(**base), q, np.array([9, 31, 40]))
    assert moved[FINGERPRINT_FIELDS.index("seq_lens_checksum")] != r0[
        FINGERPRINT_FIELDS.index("seq_lens_checksum")]
    with pytest.raises(InvalidBatchError, match="seq_lens has 2"):
        step_fingerprint(ArenaConfig.deepseek_v4(**base), q, s[:2])


V41 = dict(device="cpu", max_model_len=4096, max_num_seqs=8, max_num_batched_tokens=256)


@pytest.mark.parametrize("preset", ["deepseek-v4.1-flash", "deepseek-v4.1-large"])
@pytest.mark.parametrize(("world", "interleave"), [(2, 2), (4, 8), (8, 64)])
def test_v41_is_served_with_its_sharded_groups_holding_the_rank_s_blocks(preset, world,
                                                                         interleave):
    """c1a and c2a are sharded (their compressed KV and index-K groups hold the rank's local
    blocks: a column spans R S tokens on every rank), the compressor ring is replicated, and
    the interleave respects both ratios."""
    from staticattn.arena import cache_groups

    one = {g.name: g for g in cache_groups(ArenaConfig.preset(preset, **V41))}
    cfg = ArenaConfig.preset(preset, **V41, dcp_world_size=world, dcp_rank=world - 1,
                             cp_kv_cache_interleave_size=interleave)
    assert cfg.dcp_sharded_ratios == (1, 2)
    for g in cache_groups(cfg):
        if g.name.endswith("compressor_state"):
            assert (g.columns, g.tokens_per_column) == (1, cfg.max_model_len)
            continue
        assert g.tokens_per_column == one[g.name].tokens_per_column * world == 64 * world
        assert g.columns == -(-one[g.name].columns // world)


@pytest.mark.parametrize(("fields", "match"), [
    (dict(cp_kv_cache_interleave_size=1), r"not a multiple of the sharded compress ratio 2 "
     r"\(layer types \['c2a'\]\)"),
    (dict(cp_kv_cache_interleave_size=3), "does not divide block_size=64"),
    (dict(cp_kv_cache_interleave_size=128), "does not divide block_size=64"),
    (dict(cp_kv_cache_interleave_size=6), "does not divide block_size=64"),
    (dict(dcp_rank=2), r"dcp_rank=2 is outside \[0, dcp_world_size=2\)"),
    (dict(max_image_tokens=64, max_image_spans=1), "image"),
])
def test_v41_combinations_not_served_are_config_errors(fields, match):
    with pytest.raises(ConfigError, match=match):
        ArenaConfig.preset("deepseek-v4.1-flash", **{**V41, "dcp_world_size": 2,
                                                      "cp_kv_cache_interleave_size": 2,
                                                      **fields})


def test_block_ids_of_a_sharded_group_are_checked_over_the_rank_s_columns():
    """The host check of a group's block ids reads the columns a request uses on this rank:
    ``cdiv(L, R S W)``."""
    from staticattn.arena import cache_groups

    cfg = ArenaConfig.preset("deepseek-v4.1-flash", **V41, dcp_world_size=4,
                             cp_kv_cache_interleave_size=4)
    spans = {g.name: g.tokens_per_column for g in cache_groups(cfg)}
    assert spans == {"c1a.compressed_kv": 256, "c1a.index_k": 256, "c2a.compressed_kv": 256,
                     "c2a.index_k": 256, "c2a.compressor_state": 4096}

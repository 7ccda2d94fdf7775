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


def test_c128a_is_replicated_so_the_interleave_need_not_respect_128():
    cfg = ArenaConfig.deepseek_v4(**V4, dcp_world_size=4, dcp_rank=3,
                                  cp_kv_cache_interleave_size=4)
    assert cfg.dcp_sharded_ratios == (4,)
    assert cfg.dcp_compressed_interleave == 1


def test_one_rank_ignores_the_interleave():
    ArenaConfig.deepseek_v4(**V4, cp_kv_cache_interleave_size=2)


def test_main_table_is_sharded_swa_table_is_not():
    one = ArenaConfig.deepseek_v4(**V4)
    two = ArenaConfig.deepseek_v4(**V4, dcp_world_size=2, cp_kv_cache_interleave_size=64)
    assert two.max_blocks_per_req == one.max_blocks_per_req // 2
    assert two.max_swa_blocks_per_req == one.max_swa_blocks_per_req

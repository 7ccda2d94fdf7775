"""The configurations prefill context parallelism refuses (``prefill-context-parallel.md``
§6), each a typed error naming the cause, but one served on purpose (DeepSeek V4.1's PCP
under CUDA graphs), and the DCP rank of each PCP rank (§1)."""

from __future__ import annotations

import pytest

from staticattn.arena.pcp_config import GraphMode, PCPConfig, Speculation
from staticattn.errors import ConfigError


@pytest.mark.parametrize(("fields", "gist"), [
    ({"pcp_size": 0}, "pcp_size=0 must be >= 1"),
    ({"pcp_size": 2, "dcp_size": 3}, r"valid DCP sizes are \[1, 2\]"),
    ({"pcp_size": 2, "tp_size": 2, "dcp_size": 8}, r"valid DCP sizes are \[1, 2, 4\]"),
    ({"pcp_size": 1, "tp_size": 2, "dcp_size": 4}, "tp_size=2 must be divisible by dcp_size=4"),
    ({"pcp_size": 2, "dcp_size": 2, "cp_kv_cache_interleave_size": 128},
     "divisible by cp_kv_cache_interleave_size"),
    ({"pcp_size": 2, "dcp_size": 2, "cp_kv_cache_interleave_size": 24},
     "divisible by cp_kv_cache_interleave_size"),
    ({"pcp_size": 2, "architecture": "deepseek_v4"}, "do not support PCP"),
    ({"pcp_size": 2, "architecture": "deepseek_v41", "dcp_size": 2},
     "DeepSeek-V4.1 PCP currently requires PP=DP=DCP=1"),
    ({"pcp_size": 2, "architecture": "deepseek_v41", "speculation": Speculation.MTP},
     "DeepSeek-V4.1 PCP currently requires"),
    # What the reference refuses stays refused with graphs on: V4, V4.1 under DCP, FULL.
    ({"pcp_size": 2, "architecture": "deepseek_v4", "graph_mode": GraphMode.PIECEWISE},
     "do not support PCP"),
    ({"pcp_size": 2, "architecture": "deepseek_v41", "dcp_size": 2,
      "graph_mode": GraphMode.FULL_AND_PIECEWISE}, "DeepSeek-V4.1 PCP currently requires"),
    ({"pcp_size": 2, "graph_mode": GraphMode.FULL}, "decode-only routines"),
    ({"pcp_size": 2, "architecture": "deepseek_v41", "graph_mode": GraphMode.FULL},
     "decode-only routines"),
    ({"pcp_size": 2, "speculation": Speculation.OTHER}, "DSpark or single-module MTP"),
    ({"pcp_size": 2, "tp_size": 2, "dcp_size": 4, "speculation": Speculation.DSPARK,
      "num_q_heads": 256}, "DCP=1 or DCP=PCP"),
    ({"pcp_size": 2, "dcp_size": 2, "dcp_comm_backend": "a2a"}, "dcp_comm_backend='ag_rs'"),
    ({"pcp_size": 2, "dcp_size": 2, "kv_cache_dtype": "auto"}, "fp8_ds_mla upconvert"),
    # 128 heads over TP 2: 64 local heads pad to 64, the 128 TP-gathered ones to 128.
    ({"pcp_size": 2, "tp_size": 2, "dcp_size": 4}, "same fp8 decode kernel envelope"),
    ({"pcp_size": 2, "architecture": "glm_moe_dsa"}, "architecture 'glm_moe_dsa' is unknown"),
])
def test_refused(fields, gist):
    with pytest.raises(ConfigError, match=gist):
        PCPConfig(**fields)


@pytest.mark.parametrize("fields", [
    {"pcp_size": 2},
    {"pcp_size": 4, "dcp_size": 4, "cp_kv_cache_interleave_size": 64,
     "graph_mode": GraphMode.FULL_AND_PIECEWISE, "speculation": Speculation.MTP},
    {"pcp_size": 2, "tp_size": 4, "dcp_size": 8, "num_q_heads": 1024},
    {"pcp_size": 2, "architecture": "deepseek_v41"},
    # Served on purpose although the reference runs V4.1's PCP eagerly only (pcp_config).
    {"pcp_size": 2, "architecture": "deepseek_v41", "graph_mode": GraphMode.PIECEWISE},
    {"pcp_size": 4, "architecture": "deepseek_v41", "graph_mode": GraphMode.FULL_AND_PIECEWISE},
    {"pcp_size": 2, "dcp_size": 2, "speculation": Speculation.DSPARK},
    {"pcp_size": 1, "tp_size": 4, "dcp_size": 2},
])
def test_accepted(fields):
    PCPConfig(**fields)


@pytest.mark.parametrize(("pcp", "tp", "dcp", "want"), [
    (2, 2, 1, [[0, 0], [0, 0]]), (2, 2, 2, [[0, 1], [0, 1]]), (2, 4, 8, [[0, 1], [2, 3], [4, 5],
                                                                          [6, 7]]),
])
def test_dcp_rank_spans_pcp_first(pcp, tp, dcp, want):
    cfg = PCPConfig(pcp_size=pcp, tp_size=tp, dcp_size=dcp, num_q_heads=1024)
    assert [[cfg.dcp_rank(p, t) for p in range(pcp)] for t in range(tp)] == want
    with pytest.raises(ConfigError):
        cfg.dcp_rank(pcp)

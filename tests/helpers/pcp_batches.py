"""Global batches for the prefill-context-parallel tests: a hypothesis strategy drawing a
config and a batch, the spec's worked example, and the staged (capacity-padded) tensors a
device builder reads."""

from __future__ import annotations

import torch
from hypothesis import strategies as st

from staticattn.arena.pcp_config import PCPConfig
from staticattn.reference.pcp_layout import GlobalBatch

#: Block size of the drawn configs: small, so a request spans several blocks.
BLOCK_SIZE = 8


def fresh_prefills() -> GlobalBatch:
    """The spec's requests A (37 tokens, state 3) and B (100 tokens, state 7), fresh."""
    return GlobalBatch(query_lens=[37, 100], num_computed=[0, 0], is_prefilling=[True, True],
                       req_state_idx=[3, 7], block_table=[[10, 11, 12, 13], [20, 21, 22, 23]])


@st.composite
def pcp_cases(draw, max_reqs: int = 6, dcp: bool = True) -> tuple[PCPConfig, GlobalBatch]:
    """A config (P in 2..4, D in {1, P} or 1 when not ``dcp``) and a batch of up to
    ``max_reqs`` requests: decodes of 1-3 tokens and prefills (fresh or continued) of 0-40,
    in any order, each with a distinct state index and a block row that covers it."""
    P = draw(st.integers(2, 4))
    D = draw(st.sampled_from([1, P] if dcp else [1]))
    cfg = PCPConfig(pcp_size=P, dcp_size=D, block_size=BLOCK_SIZE, max_num_seqs=max_reqs,
                    cp_kv_cache_interleave_size=draw(st.sampled_from([1, 2, 8])))
    n = draw(st.integers(1, max_reqs))
    pre = draw(st.lists(st.booleans(), min_size=n, max_size=n))
    q = [draw(st.integers(0, 40) if p else st.integers(1, 3)) for p in pre]
    computed = [draw(st.integers(0, 30)) for _ in range(n)]
    blocks = [[draw(st.integers(1, 99)) for _ in range(-(-(c + qi) // BLOCK_SIZE) + 1)]
              for c, qi in zip(computed, q)]
    return cfg, GlobalBatch(q, computed, pre, list(range(100, 100 + n)), blocks)


def staged(batch: GlobalBatch, num_seqs: int, table_width: int = 16) -> dict[str, torch.Tensor]:
    """The batch as staged at capacity ``num_seqs`` (padded requests: 0 tokens, not
    prefilling, block row of zeros): ``query_start_loc`` int32 ``(S + 1,)``,
    ``is_prefilling`` bool ``(S,)``, ``num_computed`` and ``req_state_idx`` int32 ``(S,)``,
    ``block_table`` int32 ``(S, table_width)``."""
    pad = num_seqs - len(batch.query_lens)
    qsl = batch.query_start_loc
    table = torch.zeros(num_seqs, table_width, dtype=torch.int32)
    for i, row in enumerate(batch.block_table):
        table[i, :len(row)] = torch.tensor(row[:table_width], dtype=torch.int32)
    i32 = lambda xs: torch.tensor(xs, dtype=torch.int32)
    return {"query_start_loc": i32(qsl + [qsl[-1]] * pad),
            "is_prefilling": torch.tensor(batch.is_prefilling + [False] * pad),
            "num_computed": i32(batch.num_computed + [0] * pad),
            "req_state_idx": i32(batch.req_state_idx + [0] * pad), "block_table": table}

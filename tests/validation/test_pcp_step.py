"""The checks of a prefill-context-parallel step: a catalogue of steps that do not fit, each
with its typed error and a message naming the limit, raised before the split writes anything
(every view as it was); and on drawn batches, the host's per-rank token counts equal the
oracle's and the bucket check sits exactly at the largest rank."""

from __future__ import annotations

import dataclasses
import re

import numpy as np
import pytest
import torch
from helpers.pcp_batches import fresh_prefills, pcp_cases, staged
from hypothesis import given, settings

from staticattn.arena.pcp_config import PCPConfig
from staticattn.builders.pcp.rank_rows import RowViews
from staticattn.builders.pcp.step_rows import build_checked_rows
from staticattn.errors import CapacityError, InvalidBatchError
from staticattn.reference import pcp_layout as pcp
from staticattn.validation.pcp_step import check_pcp_step, rank_token_counts

EXAMPLES = 40
CFG = PCPConfig(pcp_size=2, dcp_size=2, max_num_seqs=4)
#: The spec's batch: ranks hold 67 and 70 tokens (P = D = 2, I = 1), A and B extents 38, 100.
N, TOKENS = 70, 137


def _host(batch: pcp.GlobalBatch) -> dict:
    return {"query_start_loc": np.array(batch.query_start_loc),
            "is_prefilling": np.array(batch.is_prefilling),
            "num_computed": np.array(batch.num_computed)}


def _replace(**changes) -> dict:
    host = _host(fresh_prefills())
    host.update({k: np.array(v) for k, v in changes.items()})
    return host


# (label, host arrays, keyword overrides, error type, a fragment the message must contain)
BAD = [
    ("bucket below the largest rank", _host(fresh_prefills()), {"N": 69}, CapacityError,
     "smaller than the largest rank-local batch (70 tokens on rank 1)"),
    ("rank tokens over the buffers", _host(fresh_prefills()), {"max_num_batched_tokens": 69},
     CapacityError, "holds 70 tokens"),
    ("bucket over the buffers", _host(fresh_prefills()), {"N": 80,
                                                          "max_num_batched_tokens": 75},
     CapacityError, "padded token count 80 exceeds"),
    ("too many requests", _replace(query_start_loc=list(range(7)), is_prefilling=[True] * 6,
                                   num_computed=[0] * 6), {}, CapacityError,
     "num_reqs=6 exceeds max_num_seqs=4"),
    ("too many global tokens", _host(fresh_prefills()), {"max_num_tokens": 136},
     CapacityError, "num_tokens=137 exceeds"),
    ("workspace too small", _host(fresh_prefills()), {"prefill_workspace": 99},
     CapacityError, "prefill request 1 needs 100 workspace entries"),
    ("decreasing starts", _replace(query_start_loc=[0, 37, 30]), {}, InvalidBatchError,
     "decreases at request 1"),
    ("negative computed", _replace(num_computed=[0, -1]), {}, InvalidBatchError,
     "num_computed[1]=-1 is negative"),
    ("lengths disagree", _replace(num_computed=[0]), {}, InvalidBatchError,
     "they must be S + 1, S, S"),
    ("not from zero", _replace(query_start_loc=[1, 37, 137]), {}, InvalidBatchError,
     "query_start_loc[0]=1"),
    ("prefilling not bools", _replace(is_prefilling=[1, 1]), {}, InvalidBatchError,
     "is_prefilling must be 1-D bools"),
]


@pytest.mark.parametrize(("label", "host", "overrides", "error", "fragment"), BAD,
                         ids=[b[0] for b in BAD])
def test_bad_steps_raise_before_writing(label, host, overrides, error, fragment):
    kw = {"N": N, "max_num_batched_tokens": 128, "max_num_tokens": TOKENS,
          "prefill_workspace": None} | overrides
    out = RowViews.allocate(CFG, kw["N"], kw["max_num_tokens"])
    for view in dataclasses.astuple(out):
        view.fill_(7)
    before = [view.clone() for view in dataclasses.astuple(out)]
    with pytest.raises(error, match=re.escape(fragment)):
        build_checked_rows(CFG, host, staged(fresh_prefills(), CFG.max_num_seqs), out,
                           max_num_batched_tokens=kw["max_num_batched_tokens"],
                           prefill_workspace=kw["prefill_workspace"])
    assert all(torch.equal(a, b) for a, b in zip(before, dataclasses.astuple(out)))


def test_a_fitting_step_is_written():
    out = RowViews.allocate(CFG, N, TOKENS)
    build_checked_rows(CFG, _host(fresh_prefills()), staged(fresh_prefills(), 4), out,
                       max_num_batched_tokens=N, prefill_workspace=100)
    assert out.num_tokens.tolist() == [67, 70]


@settings(max_examples=EXAMPLES)
@given(pcp_cases())
def test_counts_match_the_oracle_and_the_bucket_is_exact(case):
    cfg, batch = case
    lay = pcp.layout(cfg, batch)
    host = _host(batch)
    q = np.diff(host["query_start_loc"])
    rows, tokens = rank_token_counts(cfg, q, host["is_prefilling"])
    assert tokens.tolist() == lay.num_tokens
    assert rows.tolist() == [sum(r.length > 0 for r in rs) for rs in lay.rows]
    largest = max(lay.num_tokens)
    kw = {"max_num_batched_tokens": 256, "max_num_tokens": 256}
    got = check_pcp_step(cfg, host["query_start_loc"], host["is_prefilling"],
                         host["num_computed"], num_tokens_padded=largest, **kw)
    assert got.tolist() == lay.num_tokens
    if largest:
        with pytest.raises(CapacityError, match="smaller than the largest rank-local batch"):
            check_pcp_step(cfg, host["query_start_loc"], host["is_prefilling"],
                           host["num_computed"], num_tokens_padded=largest - 1, **kw)

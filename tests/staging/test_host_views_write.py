"""The checked writer of the in-place views (``HostViews.write``): it writes what a plain
numpy assignment writes, and refuses what that assignment converts without a word -- a
float truncated, a bool read as 0 or 1, an integer wrapped past the view's dtype -- with a
typed error naming the view, before anything is written."""

from __future__ import annotations

import numpy as np
import pytest

from staticattn.arena import ArenaConfig
from staticattn.builders import make_arena
from staticattn.errors import InvalidBatchError


def _views(**kw):
    cfg = ArenaConfig.deepseek_v4(device="cpu", max_num_seqs=8, max_num_batched_tokens=64,
                                  max_model_len=4096, **kw)
    return make_arena(cfg)[1].host


@pytest.mark.parametrize("values", [[100, 200], np.array([100, 200], np.uint8),
                                    np.array([100, 200], np.int64), (100, 200)])
def test_integers_are_written_as_a_plain_assignment_writes_them(values):
    views = _views()
    views.write("seq_lens", values, start=1)
    assert views.seq_lens[:3].tolist() == [0, 100, 200]
    views.write("slot_mapping", np.array([-1, 2**40]))
    assert views.slot_mapping[:2].tolist() == [-1, 2**40]


@pytest.mark.parametrize("name, values, fragment", [
    ("seq_lens", [100.7, 200.2], "float64"),
    ("seq_lens", np.array([100.0, 200.0], np.float32), "float32"),
    ("seq_lens", [True, False], "bool"),
    ("query_start_loc", np.array([[0, 1]]), "shape (1, 2)"),
    ("seq_lens", np.array([2**32 + 100]), "outside int32"),
    ("seq_lens", np.array([-(2**31) - 1]), "outside int32"),
    ("slot_mapping", np.array([2**63], np.uint64), "outside int64"),
    ("replay_start", [0], "no integer view 'replay_start'"),
    ("counts", [1], "no integer view 'counts'"),
])
def test_what_an_assignment_would_convert_is_refused_before_anything_is_written(
        name, values, fragment):
    views = _views()
    before = {n: getattr(views, n).copy() for n in ("seq_lens", "slot_mapping",
                                                     "query_start_loc", "counts")}
    with pytest.raises(InvalidBatchError, match=fragment.replace("(", r"\(").replace(")", r"\)")):
        views.write(name, values)
    for n, was in before.items():
        assert np.array_equal(getattr(views, n), was), n


def test_an_empty_write_and_bounded_replay_starts():
    views = _views()
    views.write("seq_lens", [])
    v41 = make_arena(ArenaConfig.preset("deepseek-v4.1-flash", device="cpu",
                                        max_num_seqs=8, max_num_batched_tokens=64,
                                        max_model_len=4096))[1].host
    v41.write("replay_start", np.array([0, 4], np.int32))
    assert v41.replay_start[:2].tolist() == [0, 4]

"""``GraphManager.write_blocks(table, row, block_ids, start)``: a row or a start column that
is not an int -- a bool (an int to Python), a float, a numpy float, a string -- is a typed
error that names it, with the table unchanged; numpy integers are ints."""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch
from helpers.support import DEVICE, quiet
from helpers.toy import ToyBuilder, ToyStep

from staticattn.arena import ArenaConfig
from staticattn.builders import make_arena
from staticattn.errors import InvalidBatchError
from staticattn.graphs import GraphManager

CFG = ArenaConfig.deepseek_v4(max_num_seqs=4, max_num_batched_tokens=32, max_model_len=512,
                              device=DEVICE)
NOT_INTS = [True, False, 1.0, np.float32(1), "1", None]


def _manager():
    b = ToyBuilder()
    arena, inputs = make_arena(CFG, [b])
    inputs.block_table.fill_(1)
    return GraphManager(arena, inputs, [b], ToyStep(CFG, arena.device),
                        quiet(num_kv_blocks=64)), inputs.block_table


@pytest.mark.parametrize("value", NOT_INTS, ids=repr)
def test_a_row_or_a_start_that_is_not_an_int_is_refused(value):
    gm, table = _manager()
    before = table.clone()
    with pytest.raises(InvalidBatchError, match=re.escape(f"row {value!r} is outside")):
        gm.write_blocks("block_table", value, [5])
    with pytest.raises(InvalidBatchError, match=re.escape(f"columns [{value!r}, ")):
        gm.write_blocks("block_table", 1, [5], value)
    assert torch.equal(table, before)


def test_numpy_integers_are_ints():
    gm, table = _manager()
    gm.write_blocks("block_table", np.int64(2), [5], np.int32(1))
    assert table[2, :2].tolist() == [1, 5]

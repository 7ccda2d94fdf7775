"""DeepSeek V4.1's gate of the compressed and index-K slots (``docs/spec/deepseek-v41.md``
§5.1-§5.2): only a token whose own slot is -1 writes no entry. Slot 0 -- the first slot of
SWA block 0 -- is a slot like any other: a step whose first token sits there builds the
same compressed and index-K slots, eager and graph-safe, on both backends, as the same step
on other SWA blocks (the slots of §11 case 1)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from helpers.support import DEVICE, HostStep, slots_for, stage

from staticattn.arena import ArenaConfig
from staticattn.builders import Batch, default_builders, make_arena

#: §11 case 1: two fresh prefills of 5 and 9 tokens and their group tables.
Q, S = [5, 9], [5, 9]
TABLES = {
    "c1a.compressed_kv": [[3], [5, 6]], "c1a.index_k": [[4], [7, 9]],
    "c2a.compressed_kv": [[11, 0], [12, 16]], "c2a.index_k": [[31, 0], [32, 36]],
    "c2a.compressor_state": [[1], [2]],
}


def _slots(backend: str, first_swa_block: int, mixed: bool) -> dict:
    """Every type's compressed and index-K slots of case 1, request 0's SWA row starting at
    block ``first_swa_block``."""
    cfg = ArenaConfig(
        architecture="deepseek_v41", compress_ratios=(0, 2, 1), sliding_window=4,
        swa_block_size=4, block_size=8, index_topk=4, max_num_seqs=4,
        max_num_batched_tokens=16, max_model_len=64, num_sms=4, device=DEVICE,
        kernel_backend=backend)
    builders = {b.name: b for b in default_builders(cfg)}
    _, inputs = make_arena(cfg, list(builders.values()))
    swa = np.arange(1, 1 + 2 * cfg.max_swa_blocks_per_req, dtype=np.int32).reshape(2, -1)
    swa[0, 0] = first_swa_block
    own = slots_for(swa, cfg.swa_block_size, Q, S)
    step = HostStep(np.asarray(Q, np.int32), np.asarray(S, np.int32), own,
                    np.ones((2, cfg.max_blocks_per_req), np.int32), swa, 2, 14)
    for name, rows in TABLES.items():
        view = inputs.block_tables[name]
        view.zero_()
        for b, row in enumerate(rows):
            view[b, : len(row)] = torch.tensor(row, dtype=torch.int32)
    batch = stage(inputs, step)
    if mixed:
        batch = Batch.for_mixed_capture(inputs, 2, 14)
    build = (lambda x: x.build_mixed(batch)) if mixed else (lambda x: x.build(batch))
    kv = build(builders["compressed"]).types
    out = {"own": own.tolist()}
    for t in ("c1a", "c2a"):
        out[f"{t} compressed"] = kv[t].slot_mapping[:14].tolist()
        out[f"{t} index K"] = build(builders[f"indexer.{t}"]).slot_mapping[:14].tolist()
    return out


@pytest.mark.parametrize("mixed", [False, True], ids=["eager", "graph-safe"])
def test_a_token_on_slot_zero_writes_its_entries(backend, mixed):
    at_zero, elsewhere = _slots(backend, 0, mixed), _slots(backend, 1, mixed)
    assert at_zero.pop("own")[0] == 0 and elsewhere.pop("own")[0] == 4
    assert at_zero == elsewhere
    assert at_zero["c1a compressed"][0] == 24 and at_zero["c1a index K"][0] == 32

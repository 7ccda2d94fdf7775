"""The per-rank body of the multi-process prefill-context-parallel test
(``distributed/test_pcp_gloo.py``): each rank joins a gloo group over a file store, builds its
pieces of the same global batches, all-gathers its fixed-size segments and writes what it
gathered to ``<out>/rank<r>.json``. Spawned through :func:`helpers.dcp_workers.run`."""

from __future__ import annotations

import json
import os
from datetime import timedelta

import numpy as np
import torch
import torch.distributed as dist

from helpers.dcp_workers import join_group, leave_group
from helpers.pcp_batches import staged
from staticattn.arena.pcp_config import PCPConfig
from staticattn.builders.pcp.rank_fields import gathered_slots
from staticattn.builders.pcp.rank_rows import RowViews, build_rows
from staticattn.reference.pcp_layout import GlobalBatch

#: Requests a step and tokens a rank at most: every drawn step fits one padded length.
MAX_REQS, NUM_TOKENS, MAX_TOKENS = 6, 128, 256


def random_batch(rng: np.random.Generator) -> GlobalBatch:
    """Decodes of 1-3 tokens and prefills of 0-40, any order (the same on every rank: one
    seed)."""
    n = int(rng.integers(1, MAX_REQS + 1))
    pre = [bool(x) for x in rng.integers(0, 2, n)]
    q = [int(rng.integers(0, 41)) if p else int(rng.integers(1, 4)) for p in pre]
    computed = [int(x) for x in rng.integers(0, 31, n)]
    blocks = [[int(b) for b in rng.integers(1, 100, 16)] for _ in range(n)]
    return GlobalBatch(q, computed, pre, list(range(n)), blocks)


def gathered_steps(rank: int, out: str, world: int, dcp: bool, steps: int) -> None:
    """For each step: this rank's ``hidden`` (each local token's global index, as a float
    hidden state) and its segment of the gathered slot mapping, all-gathered over the ranks;
    then the gathered hidden states restored to global order."""
    dist.init_process_group("gloo", init_method=f"file://{out}/store", rank=rank,
                            world_size=world, timeout=timedelta(seconds=60))
    cfg = PCPConfig(pcp_size=world, dcp_size=world if dcp else 1, block_size=8,
                    cp_kv_cache_interleave_size=2, max_num_seqs=MAX_REQS)
    rng = np.random.default_rng(1234)
    rows = RowViews.allocate(cfg, NUM_TOKENS, MAX_TOKENS)
    slots = torch.empty(world * NUM_TOKENS, dtype=torch.int64)
    records = []
    for _ in range(steps):
        batch = random_batch(rng)
        inputs = staged(batch, MAX_REQS)
        build_rows(cfg, inputs["query_start_loc"], inputs["is_prefilling"],
                   inputs["num_computed"], rows)
        gathered_slots(cfg, rows, inputs["block_table"], cfg.dcp_rank(rank), slots)
        hidden = torch.where(rows.write_mask[rank], rows.token_to_global[rank], -1).float()
        every = [torch.empty_like(hidden) for _ in range(world)]
        dist.all_gather(every, hidden)
        segment = slots.view(world, NUM_TOKENS)[rank].clone()
        every_slots = [torch.empty_like(segment) for _ in range(world)]
        dist.all_gather(every_slots, segment)
        T = batch.query_start_loc[-1]
        restored = torch.cat(every)[rows.hidden_restore_idx[:T].long()]
        records.append({"batch": batch.__dict__, "restored": restored.long().tolist(),
                        "slot_segments": torch.stack(every_slots).tolist()})
    dist.destroy_process_group()
    with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
        json.dump({"steps": records}, f)


#: The demo path's runs: small capacities, so a step spreads over several blocks and ranks.
DEMO_STEPS = 12


def demo_steps(rank: int, out: str, world: int, steps: int = DEMO_STEPS,
               device: str = "cpu", dcp: int = 1, interleave: int = 1,
               preset: str = "deepseek-v3.2", seed: int = 7, speculative: int = 0) -> None:
    """The demo's path on one rank (gloo on CPU, NCCL on ``device`` "cuda", the rank's
    graph captured there; ``dcp`` 1 or ``world``): per step the global step drawn (half the
    time the previous step's requests continued), the rank's input views after it (what
    its builders read), and whether its restored rows equal the single-GPU step's, for the
    parent to check against the oracle (``seed``: of the steps; ``speculative``: decode
    rows of up to ``1 + speculative`` tokens)."""
    from staticattn.distributed.pcp_world import PCPSizes, next_pcp_step, pcp_pair

    device = join_group(rank, out, world, device)
    sizes = PCPSizes(max_num_seqs=4, max_num_tokens=96, max_model_len=512,
                     interleave=interleave, num_speculative_tokens=speculative)
    rng = np.random.default_rng(seed)
    with pcp_pair(preset, world, rank, None, device, sizes, dcp=dcp) as pair:
        if pair.rank.graphs:
            pair.rank.capture()
        step, records = None, []
        for _ in range(steps):
            step = next_pcp_step(rng, sizes, pair.columns, step)
            records.append(_step_record(pair, step))
    del pair  # its rank's graph holds the group's collectives
    leave_group()
    with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
        json.dump({"steps": records}, f)


def _step_record(pair, step: dict) -> dict:
    """Run ``step`` on the rank and its single-GPU twin: the step drawn, whether the
    restored rows are equal, and the rank's input views after it (what its builders read)
    and, where the model has a compressor ring, every rank's ring links, the restored
    compressor column and whether the rank's ring equals the single-GPU step's."""
    pair.write(step)
    got = pair.run(step).cpu()
    R, N = pair.rank.pcp.max_rows, pair.rank.num_tokens
    inputs, ring = pair.rank.inputs, pair.rank.views.ring
    # The PCP + DCP layer (DeepSeek V3.2 only) has no compressor.
    compressor = getattr(pair.rank.step, "compressor", None)
    return {
        "step": {k: (v.tolist() if isinstance(v, torch.Tensor) else v)
                 for k, v in step.items()},
        "equal": torch.equal(got, pair.run_single(step).cpu()),
        # The restored rows past the step's tokens: 0, not another step's.
        "tail_zero": not pair.rank.step.out[got.shape[0]:].any().item(),
        "tokens": got.shape[0],
        "query_start_loc": inputs.query_start_loc[:R + 1].tolist(),
        "seq_lens": inputs.seq_lens[:R].tolist(),
        "positions": inputs.positions[:N].tolist(),
        "slot_mapping": inputs.slot_mapping[:N].tolist(),
        "block_table": inputs.block_table[:R, :2].tolist(),
        "step_counts": inputs.step_counts.tolist(),
        "prev_row_indices": None if ring is None else ring.prev_row_indices.tolist(),
        "ring_write_slots": None if ring is None else ring.ring_write_slots.tolist(),
        "compressor": None if compressor is None else got[:, -1].tolist(),
        "ring_equal": None if compressor is None else torch.equal(
            compressor.ring_keys.cpu(), pair.single_step.compressor.ring_keys.cpu()),
        "N": N}


def ring_example(rank: int, out: str, world: int = 4) -> None:
    """The spec's worked example 4 on DeepSeek V4.1's ranks (gloo): fresh prefills of 37
    and 100 tokens whose ring blocks (column 0 of their rows of the ring's table,
    :func:`~staticattn.distributed.pcp_world.ring_rows`: the step's last column) are 5 and 9,
    ``max_num_seqs = 4``; then their next step, A's 8 tokens from 37 (its first closes the
    group 36 left open in ring slot 44; its last, 44, saves there again) and B's 21 from
    100; the rank's records of both steps."""
    from staticattn.distributed.pcp_world import PCPSizes, pcp_pair

    dist.init_process_group("gloo", init_method=f"file://{out}/store", rank=rank,
                            world_size=world, timeout=timedelta(seconds=60))
    sizes = PCPSizes(max_num_seqs=4, max_num_tokens=160, max_model_len=512)
    with pcp_pair("deepseek-v4.1-flash", world, rank, None, "cpu", sizes) as pair:
        width = pair.columns
        # Unique blocks (never the null block 0), A's ring row led by 5 and B's by 9.
        rest = iter(range(10, 10 + 2 * width))
        table = [[next(rest) for _ in range(width - 1)] + [ring] for ring in (5, 9)]
        records = [_step_record(pair, dict(
            query_lens=q, num_computed=computed, is_prefilling=[True, True],
            req_state_idx=[3, 7], table=torch.tensor(table, dtype=torch.int32)))
            for q, computed in (([37, 100], [0, 0]), ([8, 21], [37, 100]))]
    dist.destroy_process_group()
    with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
        json.dump({"steps": records}, f)


def fresh_prefill_example(rank: int, out: str, world: int = 2, dcp: int = 1) -> None:
    """The spec's worked examples 1 and 2 on DeepSeek V3.2's ranks (gloo): fresh prefills
    of 37 and 100 tokens (requests A, B; states 3, 7), 64-token blocks, A's block row led
    by 10, 11 and B's by 20, 21, ``max_num_seqs = 2`` (R = 4 rows a rank); ``dcp`` 1 or
    ``world``. The rank's record of the step."""
    from staticattn.distributed.pcp_world import PCPSizes, pcp_pair

    dist.init_process_group("gloo", init_method=f"file://{out}/store", rank=rank,
                            world_size=world, timeout=timedelta(seconds=60))
    sizes = PCPSizes(max_num_seqs=2, max_num_tokens=160, max_model_len=1024)
    with pcp_pair("deepseek-v3.2", world, rank, None, "cpu", sizes, dcp=dcp) as pair:
        # Every block of the pool (16 columns a request, the null block 0 aside) once.
        rest = iter(b for b in range(1, 2 * pair.columns + 1) if b not in (10, 11, 20, 21))
        table = [list(lead) + [next(rest) for _ in range(pair.columns - 2)]
                 for lead in ((10, 11), (20, 21))]
        record = _step_record(pair, dict(
            query_lens=[37, 100], num_computed=[0, 0], is_prefilling=[True, True],
            req_state_idx=[3, 7], table=torch.tensor(table, dtype=torch.int32)))
    dist.destroy_process_group()
    with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
        json.dump({"steps": [record]}, f)


def mismatched_prefill_flags(rank: int, out: str, world: int = 2) -> None:
    """Every rank is handed the same lengths, but rank 1 sees one request's prefilling flag
    flipped (it would split the step differently): the fenced step must raise the same
    typed error on every rank, before the step runs."""
    from staticattn.distributed.fence import fenced_step
    from staticattn.distributed.pcp_world import PCPFence, PCPSizes, pcp_pair, random_pcp_step
    from staticattn.distributed.world import Rank
    from staticattn.validation.dcp_step import StepVerdicts

    dist.init_process_group("gloo", init_method=f"file://{out}/store", rank=rank,
                            world_size=world, timeout=timedelta(seconds=60))
    me = Rank(rank, world, False, "cpu", None, timedelta(seconds=20),
              StepVerdicts(dist.FileStore(f"{out}/verdicts", world)))
    sizes = PCPSizes(max_num_seqs=4, max_num_tokens=96, max_model_len=512)
    record = {"ran": False}
    with pcp_pair("deepseek-v3.2", world, rank, None, "cpu", sizes) as pair:
        step = random_pcp_step(np.random.default_rng(5), sizes, pair.columns, num_reqs=3)
        step["is_prefilling"][-1] ^= rank == 1
        fence = PCPFence(world, rank, 1, pair.rank.pcp, pair.rank.num_tokens,
                         sizes.max_num_tokens)
        try:
            with fenced_step(me, fence, *PCPFence.step_arrays(step)):
                record["ran"] = True
        except Exception as exc:  # the record says which
            record.update(error=type(exc).__name__, message=str(exc))
    dist.destroy_process_group()
    with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
        json.dump(record, f)

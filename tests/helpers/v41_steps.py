"""DeepSeek V4.1 test support: configs of the V4.1-Flash shapes with small capacities, steps
with a block table per cache group and bounded-replay starts, staging them, and a hypothesis
strategy."""

from __future__ import annotations

import numpy as np
from hypothesis import strategies as st

from helpers.support import DEVICE, _t, host_steps, make_step, stage
from staticattn.arena import ArenaConfig, cache_groups
from staticattn.builders import Batch
from staticattn.reference import v41_compressed as oracle
from staticattn.reference.v41_compressed import V41Step
from staticattn.reference.v41_swa import num_decodes

SMALL = dict(max_num_seqs=16, max_num_batched_tokens=256, max_model_len=4096,
             max_prefill_workspace=3000, max_logits_bytes=200_000, num_sms=8)
#: V4.1-Flash's layers and sources with small capacities: SM90 blocks (64) with one draft
#: token (native next_n = 2), the varlen-like flatten layout, no draft, SM100 blocks (128).
CONFIGS = {
    "flash-n2": dict(),
    "flash-n2-flatten": dict(use_flattening=True),
    "flash-n1": dict(num_speculative_tokens=0),
    "flash-bs128-n4": dict(block_size=128, num_speculative_tokens=3),
}


def v41_config(name: str, backend: str, **overrides) -> ArenaConfig:
    return ArenaConfig.preset("deepseek-v4.1-flash", **SMALL, **CONFIGS[name], device=DEVICE,
                              kernel_backend=backend, **overrides)


def group_tables(cfg: ArenaConfig, num_reqs: int, rng: np.random.Generator,
                 null_rings: bool = True) -> dict[str, np.ndarray]:
    """Random tables of every cache group (block ids >= 1; a ring block sometimes the null
    block 0 when ``null_rings``)."""
    tables = {}
    for g in cache_groups(cfg):
        low = 0 if g.columns == 1 and null_rings else 1
        tables[g.name] = rng.integers(low, 50_000, size=(num_reqs, g.columns), dtype=np.int32)
    return tables


def make_v41_step(cfg: ArenaConfig, query_lens, seq_lens, *, rng=None, **kw) -> V41Step:
    rng = rng or np.random.default_rng(0)
    step = make_step(cfg, query_lens, seq_lens, rng=rng, **kw)
    return V41Step(step, group_tables(cfg, step.num_reqs, rng))


def write_tables(inputs, v41: V41Step) -> None:
    """The group tables' real rows into the arena, in place."""
    for name, table in v41.tables.items():
        inputs.block_tables[name][: table.shape[0]].copy_(_t(table))


def replay_starts(v41: V41Step) -> np.ndarray | None:
    """The step's replay starts as the staging takes them (None: nothing replays)."""
    return None if v41.replay_start is None else np.asarray(v41.replay_start, np.int32)


def stage_v41(inputs, v41: V41Step) -> Batch:
    """Tables in place, then ``support.stage`` (padded extents) with the replay starts."""
    write_tables(inputs, v41)
    return stage(inputs, v41.step, replay_start=replay_starts(v41))


def stage_mixed_v41(inputs, v41: V41Step, num_reqs: int, num_tokens: int) -> Batch:
    """Tables in place, the real values staged, the general staging over a bucket."""
    write_tables(inputs, v41)
    step = v41.step
    inputs.block_table[: step.num_reqs].copy_(_t(step.block_table))
    inputs.swa_block_table[: step.num_reqs].copy_(_t(step.swa_block_table))
    inputs.stage(step.query_lens, step.seq_lens, step.slot_mapping,
                 replay_start=replay_starts(v41))
    inputs.copy_to_device(num_reqs, num_tokens)
    return Batch.for_mixed_capture(inputs, num_reqs, num_tokens)


@st.composite
def v41_steps(draw, cfg: ArenaConfig, **kw):
    """``support.host_steps`` with random group tables and, for the prefill requests, replay
    starts inside their contexts (0 most often; decodes 0)."""
    step = draw(host_steps(cfg, **kw))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    d = num_decodes(step.query_lens.tolist(), cfg.decode_threshold)
    starts = [0] * d
    for q, length in zip(step.query_lens[d:], step.seq_lens[d:]):
        context = int(length) - int(q)
        starts.append(draw(st.sampled_from([0, 0, context, int(rng.integers(0, context + 1))])))
    return V41Step(step, group_tables(cfg, step.num_reqs, rng), starts)


def random_topk(cfg, v41, ratio: int, rows: int, num_decode_tokens: int,
                seed: int) -> list[list[int]]:
    """Per decode token a random set of its ``n_c(p)`` visible entries (request-local, -1
    padded); rows past the real decode tokens hold garbage."""
    rng = np.random.default_rng(seed)
    _, position, _ = oracle.tokens(v41.step)
    k = cfg.index_topk
    out = []
    for t in range(rows):
        if t >= min(num_decode_tokens, len(position)):
            out.append(rng.integers(-1, 5, size=k).tolist())
            continue
        visible = (position[t] + 1) // ratio
        chosen = rng.permutation(visible)[: rng.integers(0, min(visible, k) + 1)].tolist()
        out.append(chosen + [-1] * (k - len(chosen)))
    return out

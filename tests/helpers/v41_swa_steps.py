"""Test support for the SWA builder's V4.1 outputs: small V4 / V4.1 configs, steps with
bounded-replay starts, their staging (eager and for a token bucket), and a hypothesis
strategy that adds replay starts to ``support.host_steps``."""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck
from hypothesis import strategies as st

from helpers.support import DEVICE, _t, host_steps, slots_for
from staticattn.arena import ArenaConfig
from staticattn.builders import Batch, make_arena
from staticattn.reference.step import HostStep
from staticattn.reference.v41_swa import SWAStep, num_decodes

#: The worked examples' geometry (docs/spec/deepseek-v41.md §11): W = 4, SWA pages of 4,
#: compressed kernel block 8, K = 4, types {swaonly, c2a, c1a}, one draft token.
EXAMPLE_V41 = dict(
    device=DEVICE, architecture="deepseek_v41", compress_ratios=(0, 2, 1), block_size=8,
    sliding_window=4, swa_block_size=4, index_topk=4, max_model_len=64, max_num_seqs=4,
    max_num_batched_tokens=32, num_speculative_tokens=1,
)

#: Small capacities of the two preset shapes, for differential tests.
SMALL = dict(device=DEVICE, max_num_seqs=8, max_num_batched_tokens=192, max_model_len=2048)
CONFIGS = {
    "v4": lambda **kw: ArenaConfig.deepseek_v4(**{**SMALL, "sliding_window": 16,
                                                  "swa_block_size": 16, **kw}),
    "v4.1-flash": lambda **kw: ArenaConfig.preset(
        "deepseek-v4.1-flash", **{**SMALL, "sliding_window": 16, "swa_block_size": 8,
                                  "block_size": 16, "index_topk": 8, **kw}),
}


def world(name: str, backend: str, builder):
    """``(config, builder, inputs)``: an arena of the worked examples' geometry ("example")
    or of a :data:`CONFIGS` shape, with ``builder`` bound."""
    cfg = (ArenaConfig(**{**EXAMPLE_V41, "kernel_backend": backend}) if name == "example"
           else CONFIGS[name](kernel_backend=backend))
    _, inputs = make_arena(cfg, [builder])
    return cfg, builder, inputs


def table_rows(cfg: ArenaConfig, rows: list[list[int]], num_reqs: int) -> np.ndarray:
    """An SWA block table whose rows start with ``rows`` (the rest block 1)."""
    out = np.ones((num_reqs, cfg.max_swa_blocks_per_req), dtype=np.int32)
    for b, row in enumerate(rows):
        out[b, : len(row)] = row
    return out


def example_step(cfg: ArenaConfig, query_lens, seq_lens, swa_rows=(), *, replay_start=None,
                 num_reqs_padded=None, num_tokens_padded=None) -> tuple[HostStep, list[int]]:
    """A step with the given SWA block-table rows; slots derived from them."""
    r = len(query_lens)
    swa = table_rows(cfg, list(swa_rows), r)
    q, length = np.asarray(query_lens, np.int32), np.asarray(seq_lens, np.int32)
    slots = slots_for(swa, cfg.swa_block_size, q, length)
    main = np.ones((r, cfg.max_blocks_per_req), dtype=np.int32)
    step = HostStep(q, length, slots, main, swa, num_reqs_padded or r,
                    num_tokens_padded or int(q.sum()))
    return step, list(replay_start or [0] * r)


#: Hypothesis health checks a test over a shared (cached) arena waives.
FIXTURE_OK = [HealthCheck.function_scoped_fixture, HealthCheck.too_slow]


def write_step_tables(inputs, step: HostStep) -> None:
    """The step's main and SWA block-table rows into the arena, in place."""
    r = step.num_reqs
    inputs.block_table[:r].copy_(_t(step.block_table))
    inputs.swa_block_table[:r].copy_(_t(step.swa_block_table))


def stage_eager(inputs, step: HostStep, replay_start, image_spans=None) -> Batch:
    """Stage for an eager build (the step's padded extents); ``image_spans`` for a vision
    arena (checked by the staging)."""
    write_step_tables(inputs, step)
    counts = inputs.stage(step.query_lens, step.seq_lens, step.slot_mapping,
                          num_reqs_padded=step.num_reqs_padded,
                          num_tokens_padded=step.num_tokens_padded,
                          replay_start=_replay(inputs, replay_start), image_spans=image_spans)
    inputs.copy_to_device(counts.num_reqs_padded, counts.num_tokens_padded)
    return Batch.from_staged(inputs, counts)


def stage_bucket(inputs, step: HostStep, replay_start, num_reqs: int, num_tokens: int,
                 image_spans=None) -> Batch:
    """Stage the real step for a token bucket's build (what a mixed graph replays)."""
    write_step_tables(inputs, step)
    inputs.stage(step.query_lens, step.seq_lens, step.slot_mapping,
                 replay_start=_replay(inputs, replay_start), image_spans=image_spans)
    inputs.copy_to_device(num_reqs, num_tokens)
    return Batch.for_mixed_capture(inputs, num_reqs, num_tokens)


def _replay(inputs, replay_start):
    if inputs.replay_start is None:
        return None
    return np.asarray(replay_start, dtype=np.int32)


def oracle_step(step: HostStep, replay_start, *, padded: bool) -> SWAStep:
    """The oracle's view of a step: padded requests and tokens included or not."""
    q = [int(x) for x in step.query_lens]
    length = [int(x) for x in step.seq_lens]
    rs = [int(x) for x in replay_start]
    slots = [int(s) for s in step.slot_mapping]
    table = step.swa_block_table.tolist()
    if padded:
        extra = step.num_reqs_padded - step.num_reqs
        q, length, rs = q + [0] * extra, length + [0] * extra, rs + [0] * extra
        table += [[0] * len(table[0])] * extra
        slots += [-1] * (step.num_tokens_padded - len(slots))
    return SWAStep(q, length, rs, slots, table)


@st.composite
def replayed_steps(draw, config: ArenaConfig, kinds=("decode", "mixed", "prefill"),
                   max_reqs: int | None = None):
    """``support.host_steps`` with a replay start per request: for a prefill request any
    position of its context (0 most often), 0 for the decodes (only prefills replay)."""
    step = draw(host_steps(config, kinds=kinds, max_reqs=max_reqs,
                           max_seq_len=config.max_model_len))
    d = num_decodes(step.query_lens.tolist(), config.decode_threshold)
    rs = [0] * d
    for q, length in zip(step.query_lens[d:], step.seq_lens[d:]):
        context = int(length) - int(q)
        rs.append(draw(st.sampled_from([0, context, draw(st.integers(0, context))]))
                  if context else 0)
    return step, rs

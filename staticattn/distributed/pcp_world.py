"""What every rank of a prefill-context-parallel run sets up: the configs (the PCP split, the
rank's arena, the one-rank arena of the single-GPU step), the rank beside the single-GPU
manager of the same steps, random global steps (the same on every rank: one seed; a run's
steps continue its requests half the time), and the per-rank metadata compared with the
oracle (:mod:`staticattn.reference.pcp_layout`)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import ClassVar

import numpy as np
import torch

from staticattn.arena import ArenaConfig, cdiv
from staticattn.arena.pcp_config import GraphMode, PCPConfig, Speculation
from staticattn.builders import default_builders, make_arena
from staticattn.builders.pcp.rank_step import input_table, slot_group
from staticattn.builders.pcp.rank_views import table_columns
from staticattn.builders.pcp.ring_link import ring_table
from staticattn.distributed.pcp_consumer import SingleGatherStep
from staticattn.distributed.pcp_rank import PCPRank
from staticattn.distributed.step_keys import write_context
from staticattn.errors import ConfigError
from staticattn.graphs import EagerBuild, GraphManager, GraphOptions
from staticattn.reference import pcp_layout, pcp_ring, v41_compressed

__all__ = ["DEFAULT_SIZES", "PCP_PRESETS", "PCPFence", "PCPPair", "PCPSizes",
           "continued_pcp_step", "expected_ring_links", "global_batch", "next_pcp_step",
           "pcp_pair", "random_pcp_step", "rank_mismatches", "ring_rows", "step_slots",
           "table_rows"]

#: The presets ``--pcp`` serves, each in a graph per rank on CUDA. DeepSeek V4 is refused
#: by the reference (its backends do not support PCP). V4.1 runs eagerly there (no CUDA
#: graphs); here its ranks capture on purpose (``staticattn.arena.pcp_config`` says why).
PCP_PRESETS = ("deepseek-v3.2", "deepseek-v4.1-flash", "deepseek-v4.1-large")


@dataclass(frozen=True)
class PCPSizes:
    """A run's capacities: ``max_num_seqs`` global requests, ``max_num_tokens`` global
    tokens, ``max_model_len``, decode rows of at most ``1 + num_speculative_tokens``
    tokens; ``num_tokens`` (N), a rank's padded tokens, holds any step of those (two chunks
    of at most ``cdiv(q, 2P)`` tokens a prefill, every ``P``-th decode row whole on one
    rank: at most ``T / P + (3 + k) S``; under DCP every decode, and a prefill too short
    for ``2P`` chunks, whole on every rank: ``N = T``)."""

    max_num_seqs: int = 8
    max_num_tokens: int = 256
    max_model_len: int = 2048
    #: ``cp_kv_cache_interleave_size`` under DCP.
    interleave: int = 1
    #: ``k``, single-module MTP's draft tokens a decode row verifies (DeepSeek V3.2; V4.1's
    #: PCP takes none, §5.2); 0: no speculative decoding.
    num_speculative_tokens: int = 0

    def num_tokens(self, world: int, dcp: int = 1) -> int:
        """``N`` of ``world`` ranks (``dcp``: the DCP ranks)."""
        if dcp > 1:
            return self.max_num_tokens
        return min(self.max_num_tokens, cdiv(self.max_num_tokens, world)
                   + (3 + self.num_speculative_tokens) * self.max_num_seqs)

    @property
    def decode_threshold(self) -> int:
        """The most tokens of a decode row, ``1 + k``."""
        return 1 + self.num_speculative_tokens

    def kv_blocks(self, columns: int) -> int:
        """Blocks of the caches: ``columns`` for every request (the widest table's), and
        the null block."""
        return self.max_num_seqs * columns + 1


#: The demo's and the bench's capacities.
DEFAULT_SIZES = PCPSizes()


@dataclass(frozen=True)
class PCPFence:
    """What the step check of :func:`~staticattn.distributed.fence.fenced_step` compares
    across the PCP group (its fields, the rank's excepted, must agree): the group's size
    and this rank (under the check's field names, ``dcp_*``), the split and the
    capacities. ``group_kind`` makes the check's messages name them as PCP's."""

    group_kind: ClassVar[str] = "PCP"
    dcp_world_size: int
    dcp_rank: int
    cp_kv_cache_interleave_size: int
    pcp: PCPConfig
    num_tokens: int
    max_num_tokens: int

    @staticmethod
    def step_arrays(step: dict) -> tuple[np.ndarray, np.ndarray]:
        """The fenced ``(query_lens, seq_lens)`` of a step: the second encodes each
        request's length and prefilling flag (``2 L + pre``), which both shape the split."""
        q = np.asarray(step["query_lens"], dtype=np.int64)
        total = np.asarray(step["num_computed"], dtype=np.int64) + q
        return q, 2 * total + np.asarray(step["is_prefilling"], dtype=np.int64)


def configs(preset: str, world: int, device: str, sizes: PCPSizes, dcp: int = 1,
            rank: int = 0, eager: bool = False) -> tuple[PCPConfig, ArenaConfig, ArenaConfig]:
    """``(pcp, rank ``rank``'s arena, one-rank arena)`` of a run of ``world`` PCP ranks and
    ``dcp`` DCP ranks; :class:`ConfigError` for what ``--pcp`` does not serve (the
    reference's refusals, §6, first: V4.1 with speculative tokens among them). On CUDA the
    ranks capture (V3.2 and V4.1) unless ``eager`` (``GraphMode.NONE``)."""
    arch = ArenaConfig.preset(preset, device="cpu").architecture
    graphs = device.startswith("cuda") and not eager
    k = sizes.num_speculative_tokens
    pcp = PCPConfig(pcp_size=world, dcp_size=dcp, architecture=arch,
                    max_num_seqs=sizes.max_num_seqs,
                    cp_kv_cache_interleave_size=sizes.interleave,
                    graph_mode=GraphMode.FULL_AND_PIECEWISE if graphs else GraphMode.NONE,
                    speculation=Speculation.MTP if k else Speculation.NONE)
    if preset not in PCP_PRESETS:
        raise ConfigError(f"--pcp serves {', '.join(PCP_PRESETS)}; {preset} is not served "
                          "under prefill context parallelism yet")
    backend = "torch" if device == "cpu" else "auto"
    common = dict(max_model_len=sizes.max_model_len, device=device, kernel_backend=backend,
                  num_speculative_tokens=k)
    mine = ArenaConfig.preset(preset, max_num_seqs=pcp.max_rows,
                              max_num_batched_tokens=sizes.num_tokens(world, dcp),
                              dcp_world_size=dcp,
                              dcp_rank=pcp.dcp_rank(rank),
                              cp_kv_cache_interleave_size=sizes.interleave, **common)
    single = ArenaConfig.preset(preset, max_num_seqs=sizes.max_num_seqs,
                                max_num_batched_tokens=sizes.max_num_tokens, **common)
    return pcp, mine, single


def random_pcp_step(rng: np.random.Generator, sizes: PCPSizes, width: int,
                    num_reqs: int | None = None) -> dict:
    """A decode-first global step: decodes (one token; with speculative tokens ``1`` to
    ``1 + k``, a verified draft or a shorter row of adaptive verification), then prefills
    (fresh or continued) sharing what is left of the token budget. Host lists
    ``query_lens``, ``num_computed``, ``is_prefilling``, ``req_state_idx`` ``(S,)``;
    ``table`` int32 ``(S, width)`` unique random blocks (never the null block 0), every
    block table's rows (each its first columns)."""
    S = int(rng.integers(1, sizes.max_num_seqs + 1)) if num_reqs is None else num_reqs
    decodes = int(rng.integers(0, S + 1))
    L, top = sizes.max_model_len, sizes.decode_threshold
    # Without speculative tokens nothing more is drawn: a seed gives the steps it always gave.
    q = [int(n) for n in rng.integers(1, top + 1, decodes)] if top > 1 else [1] * decodes
    computed = [int(rng.integers(0, L - n + 1)) for n in q] if top > 1 else [
        int(c) for c in rng.integers(0, L, decodes)]
    budget = sizes.max_num_tokens - sum(q)
    for i in range(S - decodes):
        share = max(1, budget // (S - decodes - i))
        qi = int(rng.integers(1, share + 1))
        budget -= qi
        q.append(qi)
        computed.append(int(rng.integers(0, L - qi + 1)) if rng.integers(0, 2) else 0)
    # The single-GPU step wants the requests it builds as decodes first (by length: at most
    # 1 + k tokens).
    order = sorted(range(decodes, S), key=lambda i: q[i] > top)
    q[decodes:], computed[decodes:] = [q[i] for i in order], [computed[i] for i in order]
    blocks = 1 + rng.permutation(sizes.max_num_seqs * width)[: S * width]
    return dict(query_lens=q, num_computed=computed,
                is_prefilling=[i >= decodes for i in range(S)],
                req_state_idx=[int(x) for x in rng.permutation(sizes.max_num_seqs)[:S]],
                table=torch.from_numpy(blocks.reshape(S, width).astype(np.int32)))


def continued_pcp_step(rng: np.random.Generator, sizes: PCPSizes,
                       previous: dict) -> dict | None:
    """The next step of ``previous``'s requests (a :func:`random_pcp_step` or one of these),
    as an engine schedules it: each request whose previous total ``L`` is below
    ``max_model_len`` continues from ``num_computed = L`` with its state and block rows;
    a decode stays one (one token; with speculative tokens ``1`` to ``1 + k``, within
    ``max_model_len``), a prefill either finishes its prompt and decodes (one time in four)
    or takes a new share of the token budget. Decode-first, then the prefills the single
    GPU builds as decodes (as :func:`random_pcp_step` orders them); None when no request
    can continue."""
    L, top = sizes.max_model_len, sizes.decode_threshold
    total = [c + q for c, q in zip(previous["num_computed"], previous["query_lens"])]
    kept = [i for i in range(len(total)) if total[i] < L]
    if not kept:
        return None
    pre = {i: previous["is_prefilling"][i] and bool(rng.integers(0, 4)) for i in kept}
    prefills = [i for i in kept if pre[i]]
    q = dict.fromkeys(kept, 1)
    if top > 1:
        for i in kept:
            if not pre[i]:
                q[i] = int(rng.integers(1, min(top, L - total[i]) + 1))
    budget = sizes.max_num_tokens - sum(q[i] for i in kept if not pre[i])
    for n, i in enumerate(prefills):
        share = max(1, budget // (len(prefills) - n))
        q[i] = int(rng.integers(1, min(share, L - total[i]) + 1))
        budget -= q[i]
    order = sorted(kept, key=lambda i: (pre[i], q[i] > top))
    return dict(query_lens=[q[i] for i in order], num_computed=[total[i] for i in order],
                is_prefilling=[pre[i] for i in order],
                req_state_idx=[previous["req_state_idx"][i] for i in order],
                table=previous["table"][order])


def next_pcp_step(rng: np.random.Generator, sizes: PCPSizes, width: int,
                  previous: dict | None = None) -> dict:
    """The step after ``previous`` (None: the first) of a run: half the time, where one
    can, the continuation of its requests (:func:`continued_pcp_step`: a continued prefill
    or decode starting at an odd position closes the group its previous step left open, in
    the compressor ring), else a fresh :func:`random_pcp_step` of ``width`` block columns."""
    if previous is not None and rng.integers(0, 2):
        step = continued_pcp_step(rng, sizes, previous)
        if step is not None:
            return step
    return random_pcp_step(rng, sizes, width)


def step_slots(step: dict, block_size: int) -> np.ndarray:
    """The single-GPU slot mapping of a :func:`random_pcp_step`, int64 ``(T,)``: each
    token's block of its request's row, and its offset in it."""
    q = np.asarray(step["query_lens"])
    pos = np.concatenate([np.arange(c, c + n) for n, c in zip(q, step["num_computed"])])
    req = np.repeat(np.arange(q.size), q)
    block = step["table"].numpy()[req, pos // block_size].astype(np.int64)
    return block * block_size + pos % block_size


def ring_rows(table) -> torch.Tensor:
    """The rows :meth:`PCPPair.write` puts in the compressor ring's block table (V4.1's
    ratio-2 ``compressor_state`` group, :func:`~staticattn.builders.pcp.ring_link.
    ring_table`) for a drawn step's ``table`` (int ``(S, width)``, a tensor or lists): its
    columns reversed, so that a request's ring block (column 0) is none of its blocks in
    the other tables' column 0 -- a read of the wrong table shows (every other table takes
    ``table`` itself: :func:`table_rows`)."""
    return torch.as_tensor(table).flip(1)


def table_rows(table, name: str, config: ArenaConfig) -> torch.Tensor:
    """The rows a drawn step's ``table`` (int ``(S, width)``, a tensor or lists) puts in
    block table ``name`` (a ``PCPViews.tables`` name) of an arena of ``config``:
    :func:`ring_rows` in the compressor ring's table, ``table`` itself in every other."""
    return ring_rows(table) if name == ring_table(config) else torch.as_tensor(table)


def global_batch(step: dict) -> pcp_layout.GlobalBatch:
    """A drawn step (:func:`random_pcp_step`) as the oracle's global batch."""
    return pcp_layout.GlobalBatch(step["query_lens"], step["num_computed"],
                                  step["is_prefilling"], step["req_state_idx"],
                                  step["table"].tolist())


@dataclass(slots=True)
class PCPPair:
    """The rank (``rank``) and the single-GPU manager (``single``, its step
    ``single_step``) of the same steps."""

    rank: PCPRank
    single: GraphManager
    single_step: SingleGatherStep

    @property
    def columns(self) -> int:
        """The widest block table's columns (the single-GPU arena's: under DCP a rank's
        tables are narrower): a :func:`random_pcp_step`'s rows have them."""
        return max(table_columns(self.single.config).values())

    def write(self, step: dict) -> None:
        """The engine's work before a step, in both: the block rows of every table (one
        step's rows cut to each table's columns), and each request's context keys in the
        written cache (the rank's shard under DCP); the single step's token states."""
        S = len(step["query_lens"])
        table = step["table"].to(self.rank.arena.device)
        for name, view in self.rank.views.tables.items():
            rows = table_rows(table, name, self.rank.config)
            view[:S].copy_(rows[:, :view.shape[1]])
            single = input_table(self.single.inputs, name)
            single[:S].copy_(rows[:, :single.shape[1]])
        me, cfg = self.rank, self.rank.pcp
        slot_cfg, _ = slot_group(cfg, me.config)
        for b, (state, computed) in enumerate(zip(step["req_state_idx"], step["num_computed"])):
            write_context(self.single_step.cache, table[b], state, computed,
                          slot_cfg.block_size)
            write_context(me.step.cache, table[b], state, computed, slot_cfg.block_size,
                          cfg.dcp_size, me.config.dcp_rank, cfg.cp_kv_cache_interleave_size)
        states = np.repeat(step["req_state_idx"], step["query_lens"])
        self.single_step.token_states[:states.size].copy_(torch.from_numpy(states))

    def run(self, step: dict) -> torch.Tensor:
        """The rank's step: its restored rows of the step's tokens, int64
        ``(T_step, columns)``."""
        out = self.rank.run(step["query_lens"], step["is_prefilling"], step["num_computed"],
                            step["req_state_idx"])
        return out[: sum(step["query_lens"])]

    def single_args(self, step: dict) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The single-GPU ``run`` arguments of ``step``: query lengths and sequence lengths,
        int ``(S,)``, and the slots of the group the batch's slot mapping addresses (V4.1:
        the window's), int64 ``(T,)``."""
        q = np.asarray(step["query_lens"])
        seq = np.asarray(step["num_computed"]) + q
        slots = step_slots(step, slot_group(self.rank.pcp, self.single.config)[0].block_size)
        return q, seq, slots

    def run_single(self, step: dict) -> torch.Tensor:
        """The single-GPU step (the reference builds): int64 ``(T_step, columns)``."""
        return self.single.run(*self.single_args(step), eager=EagerBuild.REFERENCE).outputs


@contextlib.contextmanager
def pcp_pair(preset: str, world: int, rank: int, group, device: str,
             sizes: PCPSizes, seed: int = 0, dcp: int = 1,
             eager: bool = False) -> Iterator[PCPPair]:
    """The rank of a run (``dcp``: its DCP ranks, 1 or ``world``; ``eager``: no graph on
    CUDA either) and its single-GPU twin, over caches holding the same keys; they die with
    the block."""
    pcp, rank_cfg, single_cfg = configs(preset, world, device, sizes, dcp, rank, eager)
    blocks = sizes.kv_blocks(max(table_columns(single_cfg).values()))
    me = PCPRank(pcp, rank_cfg, sizes.num_tokens(world, dcp), sizes.max_num_tokens, group,
                 rank, blocks, seed)
    builders = default_builders(single_cfg)
    arena, inputs = make_arena(single_cfg, builders)
    step = SingleGatherStep(single_cfg, blocks, seed)
    with GraphManager(arena, inputs, builders, step,
                      GraphOptions(progress=False, num_kv_blocks=blocks)) as one:
        yield PCPPair(me, one, step)


def rank_mismatches(pair: PCPPair, step: dict) -> list[str]:
    """The rank's metadata of the last step against the oracle: its rows' query starts,
    lengths, request states and start positions, its tokens' positions and global indices,
    its segment of the gathered slot mapping, what its builders read (the input views) and,
    where the model has a ratio-2 compressor ring (V4.1), every rank's ring links
    (:func:`ring_mismatches`) and the compressor's saved rows (``ring_keys``: the rank's
    ring must equal the single-GPU step's once both have run the step). The names of the
    fields that differ."""
    me = pair.rank
    cfg, p, N = me.pcp, me.rank, me.num_tokens
    batch = global_batch(step)
    lay = pcp_layout.layout(cfg, batch, N)
    want = pcp_layout.rank_metadata(cfg, batch, lay, p, cfg.dcp_rank(p))
    n_rows, R = len(lay.rows[p]), cfg.max_rows
    v, inputs = me.views, me.inputs
    got = {
        "query_start_loc": inputs.query_start_loc[: n_rows + 1].tolist(),
        "seq_lens": inputs.seq_lens[:n_rows].tolist(),
        "start_pos": v.fields.start_pos[:n_rows].tolist(),
        "req_idx": v.fields.req_idx[:n_rows].tolist(),
        "positions": inputs.positions[:N].tolist(),
        "token_to_global": v.rows.token_to_global[p].tolist(),
    }
    mismatched = [name for name, value in got.items() if value != want[name]]
    slots = pcp_layout.gathered_slots(slot_group(cfg, me.config)[0], batch, lay,
                                      cfg.dcp_rank(p))
    if v.gathered_slots.tolist() != slots or \
            inputs.slot_mapping[:N].tolist() != slots[p * N:(p + 1) * N]:
        mismatched.append("slot_mapping")
    if inputs.seq_lens[n_rows:R].any() or inputs.query_start_loc[n_rows:R + 1].ne(
            want["query_start_loc"][-1]).any():
        mismatched.append("padding")
    if v.ring is not None:
        mismatched += ring_mismatches(v.ring, cfg, batch, lay, step,
                                      me.config.num_speculative_tokens)
        if not torch.equal(me.step.compressor.ring_keys.cpu(),
                           pair.single_step.compressor.ring_keys.cpu()):
            mismatched.append("ring_keys")
    return mismatched


def expected_ring_links(cfg: PCPConfig, batch: pcp_layout.GlobalBatch, lay: pcp_layout.Layout,
                        table: list[list[int]], num_speculative_tokens: int
                        ) -> tuple[list[list[int]], list[int]]:
    """The oracle's ring links of a step (:func:`staticattn.reference.pcp_ring.ring_links`,
    with the oracle's ring capacity for ``num_speculative_tokens``), each request's ring
    block being column 0 of its row of ``table`` (the ring's table: :func:`ring_rows` of a
    drawn step's): ``prev_row_indices`` of every rank, padded to ``cfg.max_rows`` rows with
    -1, and ``ring_write_slots``."""
    R = cfg.max_rows
    want = pcp_ring.ring_links(batch, lay, [row[0] for row in table], R,
                               v41_compressed.ring_capacity(num_speculative_tokens))
    return ([links + [-1] * (R - len(links)) for links in want["prev_row_indices"]],
            want["ring_write_slots"])


def ring_mismatches(ring, cfg: PCPConfig, batch: pcp_layout.GlobalBatch,
                    lay: pcp_layout.Layout, step: dict, num_speculative_tokens: int) -> list[str]:
    """The names of the fields of a rank's ``RingLinks`` after the last step that differ
    from :func:`expected_ring_links`: ``prev_row_indices``, ``ring_write_slots``."""
    want = expected_ring_links(cfg, batch, lay, ring_rows(step["table"]).tolist(),
                               num_speculative_tokens)
    return [name for name, value in zip(("prev_row_indices", "ring_write_slots"), want)
            if getattr(ring, name).tolist() != value]

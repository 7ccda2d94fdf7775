"""Shared test support: host-side steps (:class:`staticattn.reference.step.HostStep`) with
random block tables, staging them into an arena, and one hypothesis strategy that draws
realistic steps for a config."""

from __future__ import annotations

import numpy as np
import torch
from hypothesis import strategies as st

from staticattn.arena import ArenaConfig
from staticattn.builders import Batch
from staticattn.graphs import GraphOptions
from staticattn.reference.step import HostStep
from staticattn.staging import StepInputs

#: The one place that decides where tests run kernels: the GPU when there is one (Triton
#: compiles only for it, and the torch kernels run there too), else the CPU (Triton
#: interpreted, see conftest.py). Tests take it from here or from the ``device`` fixture and
#: never choose a device of their own for kernel work.
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
#: The KV pool (blocks) of the tests' managers: :func:`make_step` draws block ids in
#: ``[1, NUM_KV_BLOCKS)``, the random steps of ``staticattn.bench`` in a smaller pool.
NUM_KV_BLOCKS = 100_000


#: The gather consumer's kernels in tests whose subject is the builders: on CPU the torch
#: kernels, which sum what the interpreted Triton ones sum at a fraction of the time (the
#: consumer's own Triton kernels are tested in test_gather_consumer*.py); on the GPU the
#: config's backend.
READER_BACKEND = "torch" if DEVICE == "cpu" else None


def span_fault(cfg: ArenaConfig, spans, q, s) -> bool:
    """Whether image spans (``(request, first, last)`` rows) break ``vllm-0.33-extras.md`` §3
    for a step of query lengths ``q`` and sequence lengths ``s`` (plain Python, every pair
    compared): within the capacity, each in an existing request with ``0 <= first <= last <
    L``, wholly in the query or wholly before it, at most ``W + mit`` tokens, no two of a
    request overlapping."""
    if len(spans) > cfg.max_image_spans:
        return True
    for b, first, last in spans:
        if not (0 <= b < len(q) and 0 <= first <= last < s[b]):
            return True
        if first < s[b] - q[b] <= last or last - first >= cfg.sliding_window + \
                cfg.max_image_tokens:
            return True
    return any(a[0] == c[0] and a[1] <= c[2] and c[1] <= a[2]
               for i, a in enumerate(spans) for c in spans[i + 1:])


def fuzz_examples(backend: str, full: int, interpreted: int) -> int:
    """How many examples a fuzz test draws: ``full``, or ``interpreted`` for the Triton
    backend on CPU, where the interpreter runs each kernel program in Python (thousands of
    times slower than compiled): there the torch backend draws the full count over the same
    strategy, and the GPU suite the full count on both."""
    return interpreted if backend == "triton" and DEVICE == "cpu" else full


def quiet(**options) -> GraphOptions:
    """The options of a test's manager: no progress bar, the tests' KV pool, then
    ``options``."""
    return GraphOptions(**{"progress": False, "num_kv_blocks": NUM_KV_BLOCKS, **options})


def index_ratio_fields(ratio: int) -> dict:
    """ArenaConfig fields of a model whose indexer K cache has compress ratio ``ratio``:
    DeepSeek V3.2's sparse MLA layers (``R = 1``), or DeepSeek V4's C4A layers (``R = 4``,
    which attend a window too)."""
    if ratio == 1:
        return dict(architecture="deepseek_v32", compress_ratios=(1,))
    return dict(architecture="deepseek_v4", compress_ratios=(ratio,), sliding_window=128)


def slots_for(block_table: np.ndarray, block_size: int, query_lens, seq_lens) -> np.ndarray:
    """Uncompressed KV slot of every token: ``bt[b, p // bs] * bs + p % bs``."""
    out = []
    for b, (q, L) in enumerate(zip(query_lens, seq_lens)):
        for j in range(int(q)):
            p = int(L) - int(q) + j
            out.append(int(block_table[b, p // block_size]) * block_size + p % block_size)
    return np.asarray(out, dtype=np.int64)


def make_step(
    config: ArenaConfig,
    query_lens,
    seq_lens,
    *,
    num_reqs_padded: int | None = None,
    num_tokens_padded: int | None = None,
    invalid_tokens=(),
    rng: np.random.Generator | None = None,
    num_blocks: int = NUM_KV_BLOCKS,
) -> HostStep:
    """A step with random block tables (block ids >= 1; 0 is the null block) and slots
    derived from them; ``invalid_tokens`` get slot -1."""
    rng = rng or np.random.default_rng(0)
    q = np.asarray(query_lens, dtype=np.int32)
    L = np.asarray(seq_lens, dtype=np.int32)
    r = q.shape[0]
    bt = rng.integers(1, num_blocks, size=(r, config.max_blocks_per_req), dtype=np.int32)
    swa_bt = None
    if config.has_swa:
        swa_bt = rng.integers(
            1, num_blocks, size=(r, config.max_swa_blocks_per_req), dtype=np.int32
        )
        slots = slots_for(swa_bt, config.swa_block_size, q, L)
    else:
        # Under DCP a main-table column spans block_size * dcp_world_size tokens (the slots
        # are then only placeholders: the indexer computes each rank's own).
        slots = slots_for(bt, config.block_size * config.dcp_world_size, q, L)
    for t in invalid_tokens:
        slots[t] = -1
    nt = int(q.sum())
    return HostStep(
        q, L, slots, bt, swa_bt,
        r if num_reqs_padded is None else num_reqs_padded,
        nt if num_tokens_padded is None else num_tokens_padded,
    )


def stage(inputs: StepInputs, step: HostStep, replay_start=None) -> Batch:
    """Write the step's block tables into the arena, stage the small inputs (and the replay
    starts, given), run the staging kernel, and return the arena-view batch (padded
    extents)."""
    r = step.num_reqs
    inputs.block_table[:r].copy_(_t(step.block_table))
    if step.swa_block_table is not None:
        inputs.swa_block_table[:r].copy_(_t(step.swa_block_table))
    counts = inputs.stage(
        step.query_lens, step.seq_lens, step.slot_mapping,
        num_reqs_padded=step.num_reqs_padded, num_tokens_padded=step.num_tokens_padded,
        replay_start=replay_start,
    )
    inputs.copy_to_device(counts.num_reqs_padded, counts.num_tokens_padded)
    return Batch.from_staged(inputs, counts)


def _t(a: np.ndarray):
    return torch.from_numpy(np.ascontiguousarray(a))


# ------------------------------------------------------------------ hypothesis strategy
STEP_KINDS = ("uniform_decode", "decode", "mixed", "prefill")


@st.composite
def host_steps(
    draw,
    config: ArenaConfig,
    kinds=STEP_KINDS,
    max_reqs: int | None = None,
    max_seq_len: int | None = None,
):
    """Realistic steps for ``config``.

    * ``uniform_decode``: k requests of ``next_n`` tokens, padded to a captured size
      ``S >= k`` (query length 0, sequence length 0, slots -1) or not padded;
    * ``decode``: MTP decodes with variable accepted lengths ``1..next_n``;
    * ``mixed``: decodes first, then extends (context > 0) and fresh prefills;
    * ``prefill``: only prefills / extends.
    Long and short sequences, some tokens with slot -1, random block ids.
    """
    n = config.next_n
    kind = draw(st.sampled_from(kinds))
    cap_reqs = min(config.max_num_seqs, max_reqs or config.max_num_seqs)
    cap_len = min(config.max_model_len, max_seq_len or config.max_model_len)
    budget = config.max_num_batched_tokens
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)

    def seq_len(q: int, fresh: bool = False) -> int:
        if fresh:
            return q
        # Mix very short (near the query) and long sequences.
        hi = cap_len
        if draw(st.booleans()):
            hi = min(cap_len, q + draw(st.integers(0, 300)))
        return draw(st.integers(min(q + (0 if q == 0 else 1), hi), hi)) if hi > q else q

    q_lens: list[int] = []
    s_lens: list[int] = []
    pad_reqs = pad_tokens = None
    if kind == "uniform_decode":
        max_k = max(1, min(cap_reqs, budget // n))
        k = draw(st.integers(1, max_k))
        q_lens = [n] * k
        s_lens = [seq_len(n) for _ in range(k)]
        if draw(st.booleans()):
            pad_reqs = draw(st.integers(k, max_k))
            pad_tokens = pad_reqs * n
    else:
        num_dec = 0 if kind == "prefill" else draw(st.integers(0 if kind == "mixed" else 1,
                                                                 min(cap_reqs, budget // n)))
        for _ in range(num_dec):
            q = draw(st.integers(1, n))
            q_lens.append(q)
            s_lens.append(seq_len(q))
        if kind in ("mixed", "prefill"):
            remaining = budget - sum(q_lens)
            num_pre = draw(st.integers(1 if kind == "prefill" else 0,
                                       max(0, min(cap_reqs - num_dec, 6))))
            for _ in range(num_pre):
                if remaining <= n:
                    break
                q = draw(st.integers(n + 1, min(remaining, cap_len, n + 600)))
                fresh = draw(st.booleans())
                q_lens.append(q)
                s_lens.append(seq_len(q, fresh=fresh))
                remaining -= q
        if not q_lens:
            q_lens, s_lens = [1], [seq_len(1)]
    total = sum(q_lens)
    invalid = []
    if total and draw(st.booleans()):
        invalid = sorted(set(draw(st.lists(st.integers(0, total - 1), max_size=4))))
    return make_step(config, q_lens, s_lens, num_reqs_padded=pad_reqs,
                     num_tokens_padded=pad_tokens, invalid_tokens=invalid, rng=rng)

"""Decode graphs keyed by context as well as by batch size, so that a step's cost follows
the contexts it serves rather than ``max_model_len``.

A graph bakes in the widths its consumer sizes from the batch's ``max_seq_len`` (the
indexer's logits row and top-k scan, for one): captured for a 1M-token limit, every replay
pays for 1M even when every context is 2K. :class:`ContextGraphs` keeps one
:class:`~staticattn.graphs.manager.GraphManager` per context bucket over the same arena,
inputs, builders and step, each capturing its decode graphs with ``max_seq_len`` = its
bucket, all in one memory pool (a :class:`ContextBucket` each); a uniform decode step goes
to the smallest bucket that holds its longest sequence (the host has the lengths: a
bisection over a dozen bounds), any other step to the capacity-wide manager, which also
holds the token buckets. The arena is the one
allocation, sized for the largest bucket; the buckets are views of it, not new buffers.
"""

from __future__ import annotations

import bisect
import operator
from collections.abc import Sequence

import numpy as np

from staticattn.arena import ArenaConfig
from staticattn.errors import GraphError
from staticattn.graphs.captured import CapturedGraph, RunResult, RunStats
from staticattn.graphs.manager import GraphManager
from staticattn.graphs.options import EagerBuild, GraphOptions
from staticattn.graphs.pool import GraphPool

__all__ = ["ContextBucket", "ContextGraphs", "default_context_buckets",
           "normalize_context_buckets"]

#: The smallest context bucket: below it a decode step costs about the same.
MIN_CONTEXT = 2048


def default_context_buckets(config: ArenaConfig) -> list[int]:
    """Powers of two from :data:`MIN_CONTEXT` below ``max_model_len``, then
    ``max_model_len`` itself (1M: 2K, 4K, ..., 512K, 1M; 4K: 2K, 4K)."""
    top = config.max_model_len
    out, c = [], MIN_CONTEXT
    while c < top:
        out.append(c)
        c *= 2
    return [*out, top]


def normalize_context_buckets(config: ArenaConfig, contexts: Sequence[int]) -> list[int]:
    """A user's buckets, sorted and deduplicated, ending at ``max_model_len`` (added when
    missing, so every step has a bucket); each a positive int no larger."""
    out = sorted({operator.index(c) for c in contexts})
    for c in out:
        if c < 1 or c > config.max_model_len:
            raise GraphError(f"context bucket {c} must be in [1, max_model_len="
                             f"{config.max_model_len}]")
    if not out or out[-1] != config.max_model_len:
        out.append(config.max_model_len)
    return out


class ContextBucket:
    """One context bucket: a manager whose decode graphs are captured for sequences of at
    most ``context_len`` tokens, behind a check that refuses a longer step (whose consumer
    would scan too few keys) with a :class:`GraphError` before anything runs.

    Takes its :class:`GraphManager` (built with ``context_len``). Offers :meth:`run` and
    :meth:`launch` (the manager's, checked), ``manager`` and ``context_len``.
    :class:`ContextGraphs` steps the manager directly: its routing has proved the fit.
    """

    def __init__(self, manager: GraphManager) -> None:
        self.manager = manager
        self.context_len = manager.context_len
        self._max_model_len = manager.config.max_model_len

    def run(self, query_lens, seq_lens, slot_mapping, *, replay_start=None, image_spans=None,
            eager: EagerBuild | None = None) -> RunResult:
        """:meth:`GraphManager.run`, for steps whose sequences fit the bucket."""
        s = np.asarray(seq_lens)
        self._fits(int(s.max()) if s.size else 0)
        return self.manager.run(query_lens, s, slot_mapping, replay_start=replay_start,
                                image_spans=image_spans, eager=eager)

    def launch(self, num_reqs: int, num_tokens: int | None = None,
               num_spans: int | None = None):
        """:meth:`GraphManager.launch`, for steps whose sequences fit the bucket."""
        if num_reqs > 0:
            self._fits(int(self.manager.host.seq_lens[:num_reqs].max()))
        return self.manager.launch(num_reqs, num_tokens, num_spans)

    def _fits(self, longest: int) -> None:
        # The widest bucket is the capacity: past it, the step's validation says why.
        if longest > self.context_len < self._max_model_len:
            raise GraphError(f"a sequence of {longest} tokens is past this context bucket "
                             f"({self.context_len}); route it to a wider one")


class ContextGraphs:
    """Graph managers per context bucket; the same calls as a :class:`GraphManager`.

    Parameters
    ----------
    arena, inputs, builders, step
        As for :class:`GraphManager` (shared by every bucket).
    contexts : sequence of int, optional
        Context buckets in tokens (default :func:`default_context_buckets`); the last is
        ``max_model_len``.
    options : GraphOptions, optional
        Given whole to every bucket's manager.

    ``context_buckets`` holds a :class:`ContextBucket` per context, smallest first; every
    bucket's manager captures into ``pool``, the one :class:`~staticattn.graphs.pool.
    GraphPool` they share.
    """

    def __init__(self, arena, inputs, builders, step, *, contexts: Sequence[int] | None = None,
                 options: GraphOptions | None = None) -> None:
        cfg = arena.config
        self.config, self.inputs = cfg, inputs
        self.contexts = (default_context_buckets(cfg) if contexts is None
                         else normalize_context_buckets(cfg, contexts))
        self.pool = GraphPool(arena.device)
        self.context_buckets = [
            ContextBucket(GraphManager(arena, inputs, builders, step, options, pool=self.pool,
                                       context_len=c)) for c in self.contexts]
        self._managers = [b.manager for b in self.context_buckets]
        self._widest = self._managers[-1]
        self._n = cfg.next_n

    # ------------------------------------------------------------------ capture
    def capture(self, sizes: Sequence[int] | None = None,
                buckets: Sequence[int] | None = None) -> list[CapturedGraph]:
        """Capture the decode ``sizes`` for every context bucket and the token ``buckets``
        (steps of any composition) for the capacity-wide one, largest context first, in
        one pool. Defaults as for :meth:`GraphManager.capture`."""
        captured = self._widest.capture(sizes, buckets)
        for m in reversed(self._managers[:-1]):
            captured += m.capture(sizes, buckets=())
        return captured

    # ------------------------------------------------------------------ dispatch
    def manager_for(self, longest: int, num_reqs: int = 0) -> GraphManager:
        """The manager of the smallest context bucket holding a sequence of ``longest``
        tokens and a decode graph of ``num_reqs`` requests (the capacity-wide one otherwise:
        past every bucket, or past its decode graphs, where its token buckets take over)."""
        i = bisect.bisect_left(self.contexts, longest)
        if i >= len(self._managers) - 1:
            return self._widest
        decode = self._managers[i].table.decode
        if num_reqs >= len(decode) or decode[num_reqs] is None:
            return self._widest
        return self._managers[i]

    def run(self, query_lens, seq_lens, slot_mapping, *, replay_start=None, image_spans=None,
            eager: EagerBuild | None = None) -> RunResult:
        """:meth:`GraphManager.run` on the manager of the step's context bucket: a uniform
        decode step by its longest sequence, any other step the capacity-wide manager.
        ``replay_start`` and ``image_spans`` as for :meth:`GraphManager.run` (a uniform
        decode step's replay starts must be 0s: its decodes replay nothing)."""
        q, s = np.asarray(query_lens), np.asarray(seq_lens)
        uniform = q.ndim == 1 and q.size > 0 and s.size == q.size and bool((q == self._n).all())
        m = self.manager_for(int(s.max()), q.size) if uniform else self._widest
        # The routing has proved the step fits m's bucket: no second scan of the lengths.
        return m.run(q, s, slot_mapping, replay_start=replay_start, image_spans=image_spans,
                     eager=eager)

    def begin_step(self):
        """The pinned staging views (shared by every bucket), once the last step read them."""
        return self._widest.begin_step()

    def launch(self, num_reqs: int, num_tokens: int | None = None,
               num_spans: int | None = None):
        """:meth:`GraphManager.launch` on the bucket of the longest sequence written into
        the views (a uniform decode step, ``num_tokens`` None), else on the capacity-wide
        manager."""
        if num_tokens is None and num_reqs > 0:
            longest = int(self.inputs.host.seq_lens[:num_reqs].max())
            # As in run: the step fits the bucket chosen, no second scan of the lengths.
            return self.manager_for(longest, num_reqs).launch(num_reqs, None, num_spans)
        return self._widest.launch(num_reqs, num_tokens, num_spans)

    # ------------------------------------------------------------------ reports
    @property
    def time_gpu(self) -> bool:
        """Whether every bucket's ``run`` records CUDA events (``RunResult.gpu_us()``)."""
        return all(m.time_gpu for m in self._managers)

    @time_gpu.setter
    def time_gpu(self, on: bool) -> None:
        for m in self._managers:
            m.time_gpu = on

    @property
    def stats(self) -> RunStats:
        """The step counts of every bucket together."""
        total = RunStats()
        for m in self._managers:
            total.replays += m.stats.replays
            total.mixed_replays += m.stats.mixed_replays
            total.eager.update(m.stats.eager)
        return total

    @property
    def pool_bytes(self) -> int:
        """The graph pool's memory, all buckets together: what each capture added to the
        one pool they share, summed (bytes)."""
        return sum(m.pool_bytes for m in self._managers)

    def describe(self) -> str:
        """Per context bucket: its graphs (as :meth:`GraphManager.describe`) and the
        replays it served; then the pool memory of every bucket together."""
        graphs = sum(len(m.table) for m in self._managers)
        return "\n\n".join([*(f"context bucket {c:,} tokens:\n{m.describe()}"
                               for c, m in zip(self.contexts, self._managers)),
                             f"all {len(self._managers)} context buckets: {graphs} graphs, "
                             f"pool {self.pool_bytes / 2**20:.2f} MiB"])

    def close(self) -> None:
        """Close every bucket's manager, then let go of the pool."""
        for m in self._managers:
            m.close()
        self.pool.close()

    def __enter__(self) -> ContextGraphs:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

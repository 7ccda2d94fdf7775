"""Capturing the graphs of a :class:`~staticattn.graphs.manager.GraphManager`: one per
uniform decode size and one per token bucket, largest first, into one shared pool.

:class:`GraphCapture` is the manager's capture half; it relies on the manager's ``arena``,
``inputs``, ``config``, ``builders``, ``step``, ``progress``, ``raw_launch``, ``graphs``,
``mixed_graphs``, ``stream`` and ``_context_len``, and rebuilds its dispatch table
(``_table``).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from staticattn.builders.batch import Batch
from staticattn.errors import GraphError
from staticattn.graphs.capture import (
    arena_contents_kept,
    capture_failed,
    capture_record,
    frozen_gc,
    progress,
    warm_up,
)
from staticattn.graphs.records import DECODE, MIXED, CapturedGraph
from staticattn.graphs.sizes import (
    bucket_requests,
    default_capture_sizes,
    default_mixed_buckets,
    normalize_capture_sizes,
    normalize_mixed_buckets,
)

__all__ = ["GraphCapture"]


class GraphCapture:
    """Capture and the graph bodies (mixed into :class:`GraphManager`)."""

    def capture(self, sizes: Sequence[int] | None = None,
                buckets: Sequence[int] | None = None) -> list[CapturedGraph]:
        """Capture one graph per decode size and one per token bucket (all in tokens),
        largest first, into one shared pool.

        ``sizes`` default to :func:`~staticattn.graphs.sizes.default_capture_sizes`,
        ``buckets`` to :func:`~staticattn.graphs.sizes.default_mixed_buckets`; an empty
        sequence captures none of that kind. Already-captured graphs are kept.
        """
        self._check_open()
        cfg = self.config
        self.require_cuda("run() still works: every step runs eagerly")
        sizes = default_capture_sizes(cfg) if sizes is None else (
            normalize_capture_sizes(cfg, sizes) if len(sizes) else [])
        buckets = (default_mixed_buckets(cfg) if buckets is None
                   else normalize_mixed_buckets(cfg, buckets))
        lacking = [b.name for b in self.builders if not hasattr(b, "build_mixed")]
        if buckets and lacking:
            raise GraphError(f"builders {lacking} have no build_mixed; capture token buckets "
                             "only with builders that do (or pass buckets=())")
        todo = [(MIXED, b) for b in buckets if b not in self.mixed_graphs]
        todo += [(DECODE, s) for s in sizes if s not in self.graphs]
        todo.sort(key=lambda item: item[1], reverse=True)
        self.open_pool()
        captured = []
        with frozen_gc(), arena_contents_kept(self.arena):
            try:
                for kind, size in progress(todo, self.progress, "capturing graphs"):
                    try:
                        captured.append(self._capture_one(kind, size))
                    except Exception as exc:
                        raise capture_failed(exc, f"the {kind} graph of {size} tokens",
                                             self.arena.device) from exc
            finally:
                self._table = self._new_table()
        return captured

    def require_cuda(self, fallback: str) -> None:
        """Raise :class:`GraphError` unless the arena is on a CUDA device; ``fallback`` says
        what still works without graphs."""
        if self.arena.device.type != "cuda":
            raise GraphError(f"CUDA graphs need a CUDA arena; this one is on "
                             f"{self.arena.device} ({fallback})")

    def open_pool(self) -> None:
        """Make, on first use, the memory pool every graph shares, the side stream captures
        run on, and fix the replay stream (the one current now)."""
        if self._pool is None:
            self._pool = torch.cuda.graph_pool_handle()
            self._capture_stream = torch.cuda.Stream(self.arena.device)
            self.stream = torch.cuda.current_stream(self.arena.device)

    @property
    def pool_bytes(self) -> int:
        """What this manager's captures added to the graph pool (bytes): the pool's size when
        the pool is its own."""
        return sum(g.pool_bytes for g in (*self.graphs.values(), *self.mixed_graphs.values()))

    def graph_for(self, size: int, kind: str = DECODE) -> CapturedGraph:
        """The graph captured for ``size`` tokens (``kind`` "decode" or "mixed")."""
        self._check_open()
        graphs = self.graphs if kind == DECODE else self.mixed_graphs
        if size not in graphs:
            raise GraphError(f"no {kind} graph of {size} tokens was captured; captured: "
                             f"{sorted(graphs) or 'none'}")
        return graphs[size]

    def _capture_one(self, kind: str, size: int) -> CapturedGraph:
        num_reqs = size // self._n if kind == DECODE else bucket_requests(self.config, size)
        record = capture_record(
            kind, size, num_reqs, lambda: self.stage_warm_up(kind, num_reqs, size),
            lambda: self.body(kind, num_reqs, size), capture_stream=self._capture_stream,
            pool=self._pool, stream=self.stream, raw_launch=self.raw_launch)
        (self.graphs if kind == DECODE else self.mixed_graphs)[size] = record
        return record

    def stage_warm_up(self, kind: str, num_reqs: int, num_tokens: int) -> None:
        """Stage the minimal step a graph is warmed up and captured with: every request as
        long as its query (a decode graph: ``num_reqs`` decodes of ``next_n``; a bucket: one
        fresh prefill), no slot written. Replays then see longer sequences."""
        if kind == DECODE:
            q = np.full(num_reqs, self._n)
        else:
            q = np.array([min(num_tokens, self.config.max_model_len)])
        self.inputs.stage(q, q, np.full(int(q.sum()), -1, dtype=np.int64))

    def warm_up(self, num_reqs: int, num_tokens: int, stream: torch.cuda.Stream) -> None:
        """Run one decode graph's body eagerly at minimal sequence lengths, so the capture
        that follows compiles nothing and starts short."""
        self.stage_warm_up(DECODE, num_reqs, num_tokens)
        warm_up(lambda: self.body(DECODE, num_reqs, num_tokens), stream)

    def body(self, kind: str, num_reqs: int, num_tokens: int):
        """What one graph holds: the staging kernels, every builder's build, the step, and
        the staging guard's event where ``staging_guard`` puts it. Returns ``(step outputs,
        {builder name: metadata})``."""
        after_staging = self.staging_guard == "staging"
        batch, metadata = self.builds(kind, num_reqs, num_tokens, mark=after_staging)
        outputs = self.step(batch, metadata)
        if not after_staging:
            self.inputs.mark_staging_read()
        return outputs, metadata

    def builds(self, kind: str, num_reqs: int, num_tokens: int, mark: bool = True):
        """The staging kernels and every builder's graph build (``build_decode`` for
        ``kind`` "decode", else ``build_mixed``) at these extents; ``mark``: record the
        staging guard's event after the staging kernels. Returns ``(batch, {builder name:
        metadata})``."""
        if kind == DECODE:
            self.inputs.copy_to_device(num_reqs, num_tokens, uniform=True, mark=mark)
            batch = Batch.for_decode_capture(self.inputs, num_reqs, self._context_len)
            return batch, {b.name: b.build_decode(batch) for b in self.builders}
        self.inputs.copy_to_device(num_reqs, num_tokens, mark=mark)
        batch = Batch.for_mixed_capture(self.inputs, num_reqs, num_tokens)
        return batch, {b.name: b.build_mixed(batch) for b in self.builders}

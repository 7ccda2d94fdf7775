"""GraphManager: one CUDA graph per uniform decode size, metadata build included.

Workflow:

1. ``GraphManager(arena, inputs, builders, step)`` -- builders already bound to ``arena``
   (see :func:`staticattn.builders.make_arena`); ``step(batch, metadata)`` is the user's own
   work, called with the batch and ``{builder.name: metadata}``. It may launch any kernels;
   it must write its outputs into memory it owns (or the arena) and return them (a tensor,
   a tuple, list or dict of tensors, or None), leading dimension = tokens.
2. ``capture(sizes)`` -- largest size first, one shared memory pool, Python's gc frozen,
   each graph = staging kernel + every builder's ``build_decode`` + ``step``, warmed up
   first with minimal sequence lengths.
3. ``run(query_lens, seq_lens, slot_mapping)`` per step -- validate; a uniform decode batch
   that fits is padded to the smallest captured size with null requests (query length 0,
   sequence length 0, slot -1), staged, and replayed: one ``replay()``, nothing else
   launched for the step. Anything else runs the same builders and step eagerly, and the
   manager counts why. Block tables are not arguments: the engine updates the rows that
   changed in ``inputs.block_table`` (and ``inputs.swa_block_table``) in place.
4. ``close()`` (or leave the ``with`` block) -- drops the graphs and their pool.

Example (on a CUDA machine)::

    import numpy as np, torch
    from staticattn import ArenaConfig, make_arena
    from staticattn.builders import IndexerMetadataBuilder, SparseSWAMetadataBuilder
    from staticattn.graphs import GraphManager

    cfg = ArenaConfig.deepseek_v4(max_model_len=65536)
    builders = [IndexerMetadataBuilder(), SparseSWAMetadataBuilder()]
    arena, inputs = make_arena(cfg, builders)
    out = torch.zeros(cfg.max_num_batched_tokens, dtype=torch.int32, device="cuda")

    def step(batch, md):  # the user's forward: reads metadata views, writes what it owns
        n = batch.num_actual_tokens
        torch.clamp(md["swa"].decode_swa_lens, max=7, out=out[:n])
        return out[:n]

    with GraphManager(arena, inputs, builders, step) as gm:
        gm.capture()  # default sizes, progress bar
        inputs.block_table[:3, :4] = torch.arange(1, 13).view(3, 4)  # engine-owned rows
        inputs.swa_block_table[:3, :80] = 7
        res = gm.run([2, 2, 2], [100, 37, 5000], np.arange(6))
        print(res.mode, res.graph_size)  # graph 8: padded to the smallest captured size
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

from staticattn.arena import Arena
from staticattn.builders.base import MetadataBuilder
from staticattn.builders.batch import Batch
from staticattn.builders.validate_host import uniform_decode_passes, validate_host_step
from staticattn.errors import GraphError, InvalidBatchError
from staticattn.graphs.capture import (
    arena_contents_kept,
    capture,
    frozen_gc,
    progress,
    warm_up,
)
from staticattn.graphs.introspect import node_census
from staticattn.graphs.records import CapturedGraph, RunResult, RunStats, slice_outputs
from staticattn.graphs.sizes import default_capture_sizes, normalize_capture_sizes
from staticattn.staging import StagedCounts, StepInputs

__all__ = ["GraphManager", "StepFn"]

StepFn = Callable[[Batch, dict[str, Any]], Any]


class GraphManager:
    """Captures and replays one CUDA graph per uniform decode size (in tokens).

    Parameters
    ----------
    arena : Arena
        Allocated; every builder is bound to it.
    inputs : StepInputs
        The arena's input views and staging.
    builders : sequence of MetadataBuilder
        Their ``build_decode`` runs inside every graph, ``build`` on the eager path.
    step : callable ``(batch, metadata) -> outputs``
        The user's work. Outputs must live in memory the step owns: a fresh tensor
        returned from inside a capture would come from the graph pool and be overwritten
        by the next replay of any graph -- results are valid until the next ``run``.
    validate : bool
        Check every step's host inputs before anything is written (default True).
    progress : bool
        Show a progress bar while capturing.
    time_gpu : bool
        Record CUDA events around each step's device work (``RunResult.gpu_us()``).
    """

    def __init__(
        self,
        arena: Arena,
        inputs: StepInputs,
        builders: Sequence[MetadataBuilder],
        step: StepFn,
        *,
        validate: bool = True,
        progress: bool = True,
        time_gpu: bool = False,
    ) -> None:
        self.arena = arena
        self.inputs = inputs
        self.config = arena.config
        self.builders = list(builders)
        self.step = step
        self.validate = validate
        self.progress = progress
        self.time_gpu = time_gpu and arena.device.type == "cuda"
        self.graphs: dict[int, CapturedGraph] = {}
        self._size_table = np.zeros(0, dtype=np.int64)
        self.stats = RunStats()
        self._pool = None
        self._stream: torch.cuda.Stream | None = None
        self._closed = False

    # ---------------------------------------------------------------- lifecycle
    def __enter__(self) -> GraphManager:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        """Release every graph and the shared pool (after the device is idle)."""
        if self._closed:
            return
        if self.graphs and torch.cuda.is_available():
            torch.cuda.synchronize(self.arena.device)
        self.graphs.clear()
        self._pool = None
        self._closed = True

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def capture_sizes(self) -> list[int]:
        return sorted(self.graphs)

    def _check_open(self) -> None:
        if self._closed:
            raise GraphError("the GraphManager is closed; create a new one to capture or run")

    # ------------------------------------------------------------------ capture
    def capture(self, sizes: Sequence[int] | None = None) -> list[CapturedGraph]:
        """Capture one graph per size (tokens), largest first, into one shared pool.

        Sizes default to :func:`default_capture_sizes`. Already-captured sizes are kept.
        """
        self._check_open()
        if self.arena.device.type != "cuda":
            raise GraphError(
                f"CUDA graphs need a CUDA arena; this one is on {self.arena.device} "
                "(run() still works: every step runs eagerly)"
            )
        sizes = (default_capture_sizes(self.config) if sizes is None
                 else normalize_capture_sizes(self.config, sizes))
        todo = [s for s in sorted(sizes, reverse=True) if s not in self.graphs]
        if self._pool is None:
            self._pool = torch.cuda.graph_pool_handle()
        if self._stream is None:
            self._stream = torch.cuda.Stream(self.arena.device)
        captured = []
        with frozen_gc(), arena_contents_kept(self.arena):
            for size in progress(todo, self.progress, "capturing graphs"):
                try:
                    captured.append(self._capture_one(size))
                except Exception as exc:
                    # The failed size is not recorded; sizes captured before stay usable.
                    torch.cuda.synchronize(self.arena.device)
                    raise GraphError(
                        f"capturing size {size} failed: {type(exc).__name__}: {exc}. The step "
                        "and every build_decode must launch only kernels on fixed buffers: no "
                        "host read (.item(), .tolist(), .cpu()), no allocation, no branch on "
                        "data (python -m staticattn check names the offending op)"
                    ) from exc
                finally:
                    self._size_table = np.zeros(0, dtype=np.int64)  # rebuilt on next use
        return captured

    def graph_for(self, size: int) -> CapturedGraph:
        """The graph captured for ``size`` tokens."""
        self._check_open()
        if size not in self.graphs:
            raise GraphError(
                f"size {size} was never captured; captured sizes: {self.capture_sizes or 'none'}"
            )
        return self.graphs[size]

    def _capture_one(self, size: int) -> CapturedGraph:
        num_reqs = size // self.config.next_n
        mem0 = torch.cuda.memory_reserved(self.arena.device)
        t0 = time.perf_counter()
        self.warm_up(num_reqs, size, self._stream)
        graph, (outputs, metadata) = capture(lambda: self._body(num_reqs, size), self._stream,
                                             pool=self._pool)
        record = CapturedGraph(
            size=size, num_reqs=num_reqs, graph=graph, outputs=outputs, metadata=metadata,
            capture_s=time.perf_counter() - t0,
            pool_bytes=torch.cuda.memory_reserved(self.arena.device) - mem0,
            nodes=node_census(graph),
        )
        self.graphs[size] = record
        return record

    def warm_up(self, num_reqs: int, num_tokens: int, stream: torch.cuda.Stream) -> None:
        """Run one graph's body eagerly at minimal sequence lengths (every request as long
        as its query), so the capture that follows compiles nothing and starts short."""
        n = self.config.next_n
        self.inputs.stage(np.full(num_reqs, n), np.full(num_reqs, n),
                          np.full(num_tokens, -1, dtype=np.int64))
        warm_up(lambda: self._body(num_reqs, num_tokens), stream)

    def _body(self, num_reqs: int, num_tokens: int):
        """What one graph holds: stage, build every builder's decode metadata, step."""
        self.inputs.copy_to_device(num_reqs, num_tokens, uniform=True)
        batch = Batch.for_decode_capture(self.inputs, num_reqs)
        metadata = {b.name: b.build_decode(batch) for b in self.builders}
        return self.step(batch, metadata), metadata

    # ---------------------------------------------------------------------- run
    def dispatch(self, query_lens: np.ndarray) -> tuple[int | None, str | None]:
        """``(graph size, None)`` if the step replays, else ``(None, reason)``."""
        n = self.config.next_n
        num_reqs = int(query_lens.shape[0])
        if num_reqs == 0 or int(query_lens.max()) > n:
            return None, "prefill"
        if int(query_lens.min()) != n:
            return None, "non-uniform"
        if not self.graphs:
            return None, "not-captured"
        size = self._replay_size(num_reqs * n)
        return (size, None) if size else (None, "too-large")

    def _replay_size(self, num_tokens: int) -> int:
        """Smallest captured size holding ``num_tokens`` (0 if none): a table lookup, built
        once per capture, because it runs on every step."""
        table = self._size_table
        if not len(table) and self.graphs:
            sizes = sorted(self.graphs)
            table = np.zeros(sizes[-1] + 1 if sizes else 0, dtype=np.int64)
            lo = 0
            for size in sizes:
                table[lo : size + 1] = size
                lo = size + 1
            self._size_table = table
        return int(table[num_tokens]) if num_tokens < len(table) else 0

    def run(
        self,
        query_lens: Sequence[int] | np.ndarray,
        seq_lens: Sequence[int] | np.ndarray,
        slot_mapping: Sequence[int] | np.ndarray,
        *,
        eager: bool = False,
    ) -> RunResult:
        """Run one step: replay if it is a uniform decode that fits, else eagerly.

        Parameters
        ----------
        query_lens, seq_lens : int ``(num_reqs,)``
            Decodes first (the batch is reordered decode -> extend -> prefill).
        slot_mapping : int64 ``(num_tokens,)``
            -1 = do not write.
        eager : bool
            Run eagerly even if a graph could replay the step (A/B checks, benchmarks);
            counted under the reason "forced".

        Returns
        -------
        RunResult
            ``outputs`` sliced to the real tokens; valid until the next ``run``.
        """
        if self._closed:
            self._check_open()
        q = np.asarray(query_lens)
        s = np.asarray(seq_lens)
        slots = np.asarray(slot_mapping)
        n = self.config.next_n
        # Replay path first, kept to a handful of numpy calls: it runs every decode step.
        k = q.shape[0] if q.ndim == 1 else 0
        size = (self._replay_size(k * n) if k and not eager and self.graphs
                and q.dtype.kind in "iu" and (q == n).all() else 0)
        if size and (not self.validate or uniform_decode_passes(k, s, slots, self.config)):
            return self._replay(self.graphs[size], s, slots, k * n)
        return self._run_general(q, s, slots, eager)

    def _replay(self, g: CapturedGraph, s: np.ndarray, slots: np.ndarray,
                num_tokens: int) -> RunResult:
        self.inputs.stage_uniform_decode(s, slots)
        events = self._record_start()
        g.graph.replay()
        self._record_end(events)
        self.stats.replays += 1
        return RunResult(slice_outputs(g.outputs, num_tokens), "graph", g.size, None, num_tokens,
                         events)

    def _run_general(self, q, s, slots, eager: bool) -> RunResult:
        """Every step the replay path did not take: full validation, then replay (a step
        the pre-screen could not clear but the full check accepts) or eager."""
        if q.ndim == 1 and q.shape[0] == 0:
            raise InvalidBatchError("a step needs at least one request; got none")
        if self.validate:
            self._validate(q, s, slots)
        size, reason = self.dispatch(q) if q.ndim == 1 and q.dtype.kind in "iu" else (
            None, "prefill")
        if eager and size is not None:
            size, reason = None, "forced"
        num_tokens = int(slots.shape[0])
        if size is not None:
            return self._replay(self.graphs[size], s, slots, num_tokens)
        counts = self.inputs.stage(q, s, slots)
        events = self._record_start()
        outputs = self.launch_eager(counts)
        self._record_end(events)
        self.stats.eager[reason] += 1
        return RunResult(outputs, "eager", None, reason, num_tokens, events)

    def _record_start(self):
        if not self.time_gpu:
            return None
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        return start, end

    @staticmethod
    def _record_end(events) -> None:
        if events is not None:
            events[1].record()

    def run_eager(self, q, s, slots) -> Any:
        """Stage, build every builder eagerly, run the step; outputs for the real tokens."""
        return self.launch_eager(self.inputs.stage(q, s, slots))

    def launch_eager(self, counts: StagedCounts) -> Any:
        """The device half of an eager step whose host values are already staged."""
        self.inputs.copy_to_device(counts.num_reqs_padded, counts.num_tokens_padded)
        batch = Batch.from_staged(self.inputs, counts)
        metadata = {b.name: b.build(batch) for b in self.builders}
        return slice_outputs(self.step(batch, metadata), counts.num_tokens)

    def _validate(self, q, s, slots) -> None:
        validate_host_step(q, s, slots, self.config, require_decode_first=True,
                           decode_threshold=self.config.decode_threshold)

    # ------------------------------------------------------------------ reports
    def describe(self) -> str:
        """A table per captured size: requests, capture time, nodes, pool memory."""
        lines = [f"{'size':>6} {'reqs':>5} {'capture ms':>11} {'kernels':>8} {'nodes':>6} "
                 f"{'pool MiB':>9}"]
        for size in sorted(self.graphs):
            g = self.graphs[size]
            nodes = g.nodes or {}
            lines.append(
                f"{size:>6} {g.num_reqs:>5} {g.capture_s * 1e3:>11.1f} "
                f"{nodes.get('kernel', '-'):>8} {sum(nodes.values()) if nodes else '-':>6} "
                f"{g.pool_bytes / 2**20:>9.2f}"
            )
        lines.append(f"replays {self.stats.replays}, eager {dict(self.stats.eager)}")
        return "\n".join(lines)

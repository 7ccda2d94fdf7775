"""Steps whose query lengths are decided on the device: one graph per token bucket holding
the producer of the lengths, the staging, every builder's build and the user's step.

An engine with adaptive verification (DeepSeek V4's drafter proposes up to ``next_n``
tokens per request and the device decides how many each request verifies) knows, on the
host, how many requests run and an upper bound on the step's tokens (``k * next_n``), but
not where one request's tokens end and the next one's begin. Reading them back would cost
a synchronisation every step. Here the boundaries never leave the device:

* the **producer** ``producer(inputs, R, T)`` -- the user's kernels, captured first in the
  graph -- writes the step into the arena's device input views: the query starts
  ``inputs.query_start_loc[: R + 1]`` (a cumulative sum from 0), ``inputs.seq_lens[:R]`` and
  ``inputs.slot_mapping[:T]``, where ``R`` and ``T`` are the graph's static extent;
* the staging pads them in place past the real ``k`` requests (the host writes ``k``, and
  only ``k``) and the real ``nt = min(query_start_loc[k], T)`` tokens, then derives
  positions, each token's request and the decode/prefill split on the device;
* the builders' mixed builds (:meth:`build_mixed`) read every count from the device.

With bounded replay (DeepSeek V4.1, ``docs/spec/deepseek-v41.md`` §8.1) the host also
knows each request's ``replay_start`` (the scheduler decides it), and hands it to
:meth:`DeviceLengthSteps.launch`: it is staged from the host like any step's, for the
prefill requests of the device's split (0s at capture and where none is given).

Contract (nothing on the host can check values it never sees): the producer's query starts
are non-decreasing from 0, each ``seq_lens[b] >= q_b``, slots address the KV pool or are
-1; a request's ``replay_start`` is at most its context ``seq_lens[b] - q_b`` and 0 for a
decode (the host checks only that it is given where the architecture replays, one per
request, none negative). The host checks ``k`` and ``T`` against the capacities; the
staging caps ``nt`` at ``T``, so a producer that overshoots loses tokens instead of
writing out of bounds.

A step no captured bucket holds runs eagerly: the producer runs, its lengths are read back
(one synchronisation) and the reference builds run on them (the replay starts fully
checked, then).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from staticattn.errors import GraphError
from staticattn.graphs.captured import CapturedGraph, GraphKind
from staticattn.graphs.capturer import GraphSpec
from staticattn.graphs.dispatch import StepKey
from staticattn.graphs.manager import GraphManager
from staticattn.graphs.sizes import bucket_requests, default_mixed_buckets, normalize_mixed_buckets
from staticattn.staging import StepInputs

__all__ = ["DeviceLengthSteps", "ProducerFn"]

DEVICE_LENGTHS = GraphKind.DEVICE_LENGTHS

#: ``producer(inputs, R, T)``: writes the step's query starts, lengths and slots (device).
ProducerFn = Callable[[StepInputs, int, int], None]


class DeviceLengthSteps:
    """Graphs of steps whose query lengths a device kernel decides (see the module).

    Parameters
    ----------
    manager : GraphManager
        Supplies the inputs, builders (each with ``build_mixed``), the user's step, its
        capturer (into its pool, replayed on its stream), its checks, and its dispatcher,
        which keeps these graphs beside its own (kind ``DEVICE_LENGTHS``) and counts their
        steps in ``manager.stats``. Its graphs hold one producer: a second producer once
        they are captured is a :class:`GraphError`.
    producer : callable ``(inputs, R, T) -> None``
        Launches the kernels that write ``inputs.query_start_loc[: R + 1]``,
        ``inputs.seq_lens[:R]`` and ``inputs.slot_mapping[:T]`` on the device. Captured in
        every graph (it must be graph-safe: no host read, no allocation outside the pool).
    """

    def __init__(self, manager: GraphManager, producer: ProducerFn) -> None:
        if not isinstance(manager, GraphManager):
            raise GraphError(f"manager must be a GraphManager; got {type(manager).__name__}")
        if not callable(producer):
            raise GraphError(f"producer must be callable as producer(inputs, R, T); got "
                             f"{type(producer).__name__}")
        lacking = [b.name for b in manager.builders if not hasattr(b, "build_mixed")]
        if lacking:
            raise GraphError(f"builders {lacking} have no build_mixed; steps with device "
                             "query lengths replay the mixed builds")
        if (manager.device_producer not in (None, producer)
                and manager.dispatcher.graphs(DEVICE_LENGTHS)):
            raise GraphError("this manager's device-length graphs hold another producer; a "
                             "manager serves one: build a second GraphManager for a second "
                             "producer")
        manager.device_producer = producer
        self.manager = manager
        self.producer = producer
        self.inputs: StepInputs = manager.inputs
        self.config = manager.config
        # The manager's: these graphs go into its dispatcher, their steps through its checks.
        self.dispatcher, self.checks = manager.dispatcher, manager.checks

    # ----------------------------------------------------------------- capture
    def capture(self, buckets: Sequence[int] | None = None) -> list[CapturedGraph]:
        """One graph per token bucket (default: the manager's default buckets), largest
        first, in the manager's pool and dispatcher; already-captured buckets are kept."""
        gm = self.manager
        gm.require_open()
        gm.pool.require_cuda("launch() still runs every step eagerly")
        buckets = (default_mixed_buckets(self.config) if buckets is None
                   else normalize_mixed_buckets(self.config, buckets))
        have = self.graphs
        todo = sorted((b for b in buckets if b not in have), reverse=True)
        return gm.capturer.capture_each([self.spec(size) for size in todo], self.dispatcher)

    def spec(self, size: int) -> GraphSpec:
        """The :class:`~staticattn.graphs.capturer.GraphSpec` of the bucket of ``size``
        tokens."""
        num_reqs = bucket_requests(self.config, size)
        return GraphSpec(DEVICE_LENGTHS, size, num_reqs,
                         lambda: self.inputs.stage_device_step(num_reqs),
                         lambda: self.body(num_reqs, size), self.config.max_model_len)

    @property
    def graphs(self) -> dict[int, CapturedGraph]:
        """The captured graphs by token bucket (tokens)."""
        return self.dispatcher.graphs(DEVICE_LENGTHS)

    def body(self, num_reqs: int, num_tokens: int) -> tuple[Any, dict[str, Any]]:
        """What one graph holds: the producer, then a token bucket's body with the
        device-starts staging (:meth:`Capturer.body <staticattn.graphs.capturer.Capturer.
        body>`). Returns ``(step outputs, {builder name: metadata})``."""
        self.producer(self.inputs, num_reqs, num_tokens)
        return self.manager.capturer.body(GraphKind.MIXED, num_reqs, num_tokens,
                                          device_starts=True)

    # ------------------------------------------------------------------ launch
    def graph_for(self, num_reqs: int, num_tokens: int) -> CapturedGraph | None:
        """The bucket the dispatcher gives a step of ``num_reqs`` requests and at most
        ``num_tokens`` tokens, or None."""
        return self.dispatcher.bucket(DEVICE_LENGTHS, num_reqs, num_tokens)

    def launch(self, num_reqs: int, num_tokens: int, *, replay_start=None) -> Any:
        """Run a step of ``num_reqs`` requests and at most ``num_tokens`` tokens whose
        boundaries the producer decides on the device.

        ``replay_start``: host ints ``(num_reqs,)`` or None (nothing replays), each request's
        first replayed position, under the module's contract.

        Replays the smallest bucket that holds it (outputs at the bucket's extent; the
        first ``nt`` rows are the step's, valid until the next step); else runs eagerly,
        counted under its reason in the manager's stats. Raises :class:`CapacityError` /
        :class:`InvalidBatchError` before anything is written when ``num_reqs`` or
        ``num_tokens`` is out of range, or ``replay_start`` is given without bounded replay,
        of another length or negative.
        """
        self.manager.require_open()
        replay_start = self.checks.device_step(num_reqs, num_tokens, replay_start)
        num_reqs, num_tokens = int(num_reqs), int(num_tokens)
        g, reason = self.dispatcher.route(StepKey(DEVICE_LENGTHS, num_tokens, num_reqs))
        if g is None:
            self.dispatcher.count_eager(reason)
            return self._eager(num_reqs, num_tokens, replay_start)
        self.inputs.stage_device_step(num_reqs, replay_start)
        g.launch()
        g.replays += 1
        return g.outputs

    def read_step(self, num_reqs: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(query_lens, seq_lens, slot_mapping)`` of the last staged step, read back from
        the device (synchronises): what the producer decided, for A/B checks. Host int64
        ``(num_reqs,)``, int64 ``(num_reqs,)``, int64 ``(num_tokens,)``."""
        qsl = self.inputs.query_start_loc[: num_reqs + 1].cpu().numpy().astype(np.int64)
        seq = self.inputs.seq_lens[:num_reqs].cpu().numpy().astype(np.int64)
        slots = self.inputs.slot_mapping[: int(qsl[-1])].cpu().numpy()
        return np.diff(qsl), seq, slots

    def _eager(self, num_reqs: int, num_tokens: int, replay_start) -> Any:
        """The producer eagerly, its lengths read back and checked (the replay starts fully,
        now), the reference builds on them (counted once, by the caller)."""
        self.inputs.wait_staging_free()
        self.producer(self.inputs, num_reqs, num_tokens)
        q, s, slots = self.read_step(num_reqs)
        step = self.manager.runner.check(q, s, slots, replay_start)
        return self.manager.run_eager(q, s, slots, step.replay_start)


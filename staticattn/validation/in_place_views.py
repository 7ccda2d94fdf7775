"""Checks of a step an engine wrote in place into the staging views, cheap enough for every
launch: a few vectorized reductions over the written prefixes.

:class:`ViewChecks` checks what keeps every kernel and consumer in bounds -- the counts
within capacity, ``0 <= seq_lens <= max_model_len``, slots ``>= -1`` and below the pool
(when its size is known), the block ids of the rows the step uses where the tables are host
memory (:class:`~staticattn.validation.block_ids.BlockIds`), and for a step of any
composition query starts that begin at 0, never decrease, end at the token count and stay
within each sequence (``q <= L``); a uniform decode step's sequences hold its ``next_n``
tokens (``L >= next_n``), as :meth:`GraphManager.run` requires of the same step: a shorter
one would give its first tokens negative positions. Decode-first order is not required on
this path: the split is found on the device, and a decode behind a prefill is built as a
prefill. With bounded replay a step of any composition also has its ``replay_start[:k]``
checked (:func:`~staticattn.validation.replay_start.check_replay_start`: inside each context, 0 for
the decodes) when any of it is non-zero; a uniform decode step does not read it.
:func:`~staticattn.validation.host_arrays.validate_host_step` is the full check, and
:meth:`GraphManager.run` applies it.

Every failure is a typed error that names the offending value, raised before anything is
launched; the views are left as the engine wrote them.
"""

from __future__ import annotations

import numpy as np

from staticattn.arena.config import ArenaConfig
from staticattn.errors import CapacityError, InvalidBatchError
from staticattn.validation.block_ids import BlockIds
from staticattn.validation.image_spans import check_image_spans, max_span_tokens, spans_pass
from staticattn.validation.replay_start import check_replay_start
from staticattn.validation.values import (
    check_non_decreasing,
    check_seq_lens,
    check_slots,
    slots_within,
)

__all__ = ["ViewChecks"]

_min = np.minimum.reduce
# An extreme is ``a.item(a.argmax())``, a third of a ufunc reduction's cost on a step's
# small prefixes (see staticattn.validation.host_arrays).


class ViewChecks:
    """Checks over one arena's host views (see the module docstring).

    Parameters
    ----------
    host : HostViews
        The staging views the engine writes.
    config : ArenaConfig
    slot_bound : int or None
        Slots must be below it (``num_kv_blocks * block_size`` of the slot mapping's group);
        None checks only ``>= -1``.
    block_ids : BlockIds, optional
        The block tables' check against the pool (it reads only host-resident tables).
    """

    def __init__(self, host, config: ArenaConfig, slot_bound: int | None,
                 block_ids: BlockIds | None = None) -> None:
        self.host = host
        self.config = config
        self.slot_bound = slot_bound
        self.blocks = block_ids if block_ids is not None and block_ids.host_tables else None
        self.next_n = config.next_n
        self.max_model_len = config.max_model_len
        self.max_num_seqs = config.max_num_seqs
        self.max_decode_reqs = min(config.max_num_batched_tokens // config.next_n,
                                   config.max_num_seqs)
        # Negative lengths read as uint32 exceed max_model_len: one pass checks both bounds.
        self._seq_u32 = host.seq_lens.view(np.uint32)
        # The written prefixes as views, made once per count (slicing costs more than
        # the check of a small prefix).
        self._decode_views: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        self._slot_views: dict[int, np.ndarray] = {}
        self._start_views: dict[int, tuple] = {}
        self._span_views: dict[int, np.ndarray] = {}
        self._span_limit = max_span_tokens(config)
        # Non-zero starts read as uint32 have a non-zero maximum: one pass finds any.
        self._replay_u32 = None if host.replay_start is None else host.replay_start.view(
            np.uint32)

    def decode(self, num_reqs: int) -> None:
        """A uniform decode step of ``num_reqs`` requests (``next_n`` tokens each; an int:
        :meth:`~staticattn.graphs.GraphManager.launch` makes sure)."""
        views = self._decode_views.get(num_reqs)
        if views is None:  # a count not seen yet: check it, then keep its prefixes
            if not 0 < num_reqs <= self.max_decode_reqs:
                self._bad_count(num_reqs)
            views = self._decode_views[num_reqs] = (
                self._seq_u32[:num_reqs], self.host.slot_mapping[: num_reqs * self.next_n])
        seq, slots = views
        # Unsigned, a negative length is past max_model_len and never the minimum.
        if (seq.item(seq.argmax()) > self.max_model_len
                or seq.item(seq.argmin()) < self.next_n):
            lens = self.host.seq_lens[:num_reqs].astype(np.int64)
            check_seq_lens(np.full_like(lens, self.next_n), lens, self.config)
        if not slots_within(slots, self.slot_bound):
            check_slots(slots, self.slot_bound)
        if self.blocks is not None:
            self.blocks.check_step(num_reqs, self.host.seq_lens[:num_reqs])

    def step(self, num_reqs: int, num_tokens: int, num_spans: int | None = None) -> None:
        """A step of any composition: ``query_start_loc[: num_reqs + 1]`` written. A vision
        model's image spans: the first ``num_spans`` rows of the block (an int the caller
        has bounded by the capacity), or, None, every row whose request is not -1."""
        cfg = self.config
        if not 0 < num_reqs <= cfg.max_num_seqs:
            self._bad_count(num_reqs)
        if not 0 <= num_tokens <= cfg.max_num_batched_tokens:
            raise CapacityError(
                f"num_tokens={num_tokens} exceeds max_num_batched_tokens="
                f"{cfg.max_num_batched_tokens}")
        views = self._start_views.get(num_reqs)
        if views is None:
            qsl = self.host.query_start_loc
            replay = self._replay_u32
            views = self._start_views[num_reqs] = (
                qsl[1 : num_reqs + 1], qsl[:num_reqs], self._seq_u32[:num_reqs],
                None if replay is None else replay[:num_reqs])
        ends, starts, seq, replay = views
        qsl = self.host.query_start_loc
        if qsl[0] != 0 or qsl[num_reqs] != num_tokens:
            raise InvalidBatchError(
                f"query_start_loc must run from 0 to num_tokens={num_tokens}; it holds "
                f"[{int(qsl[0])}, ..., {int(qsl[num_reqs])}] over {num_reqs} requests")
        query_lens = ends - starts
        # 0 <= q <= L as one unsigned comparison: a negative q reads as above any length; a
        # negative L fails the bound after it.
        if (not _min(query_lens.view(np.uint32) <= seq)
                or seq.item(seq.argmax()) > self.max_model_len):
            query_lens = check_non_decreasing("query_start_loc",
                                              qsl[: num_reqs + 1].astype(np.int64))
            check_seq_lens(query_lens, self.host.seq_lens[:num_reqs].astype(np.int64), cfg)
        if replay is not None and replay.item(replay.argmax()):
            check_replay_start(cfg, self.host.replay_start[:num_reqs], query_lens,
                               self.host.seq_lens[:num_reqs])
        spans = self.host.image_spans
        if spans is not None:
            if num_spans is None:
                requests = spans[:, 0]
                if requests.item(requests.argmax()) >= 0:  # a row holds a span
                    # The used rows gathered by index: a boolean mask of the block, or a
                    # Python filter of all its rows, costs more.
                    self._spans(spans.take((requests >= 0).nonzero()[0], axis=0).tolist(),
                                query_lens, seq, num_reqs)
            elif num_spans:
                rows = self._span_views.get(num_spans)
                if rows is None:
                    rows = self._span_views[num_spans] = spans[:num_spans]
                self._spans(rows.tolist(), query_lens, seq, num_reqs)
        self._slots(num_tokens)
        if self.blocks is not None:
            self.blocks.check_step(num_reqs, self.host.seq_lens[:num_reqs])

    def _spans(self, rows: list, query_lens: np.ndarray, seq: np.ndarray,
               num_reqs: int) -> None:
        """Rows of the span block (lists of three ints), checked against a step whose
        lengths passed: the fast path, else the full check names the bad span."""
        if not spans_pass(rows, query_lens, seq, self._span_limit):
            check_image_spans(self.config, rows, query_lens, self.host.seq_lens[:num_reqs])

    def _slots(self, num_tokens: int) -> None:
        slots = self._slot_views.get(num_tokens)
        if slots is None:
            slots = self._slot_views[num_tokens] = self.host.slot_mapping[:num_tokens]
        if num_tokens and not slots_within(slots, self.slot_bound):
            check_slots(slots, self.slot_bound)

    def _bad_count(self, num_reqs: int) -> None:
        cfg = self.config
        if isinstance(num_reqs, bool) or not isinstance(num_reqs, (int, np.integer)):
            raise InvalidBatchError(f"num_reqs must be an int, got {num_reqs!r}")
        if num_reqs > cfg.max_num_seqs:
            raise CapacityError(f"num_reqs={num_reqs} exceeds max_num_seqs={cfg.max_num_seqs}")
        if num_reqs > self.max_decode_reqs:
            raise CapacityError(
                f"num_tokens={num_reqs * self.next_n} ({num_reqs} requests x next_n) exceeds "
                f"max_num_batched_tokens={cfg.max_num_batched_tokens}")
        raise InvalidBatchError(f"a step needs at least one request; got num_reqs={num_reqs}")

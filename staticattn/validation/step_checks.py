"""The one facade through which a graph manager checks a step, once, before anything is
written: whichever way the step comes (host arrays to ``run``, views written in place for
``launch``, a request count for steps whose lengths a device kernel decides), every check
it needs -- host arrays and values, views, block ids, extents, replay starts, image spans --
is reached through :class:`StepChecks`.

With ``validate`` off (the engine vouches for its steps) only what keeps every kernel in
bounds is checked: the extents of the staging.
"""

from __future__ import annotations

import operator
from typing import NamedTuple

import numpy as np

from staticattn.arena.config import ArenaConfig
from staticattn.errors import CapacityError, GraphError, InvalidBatchError
from staticattn.validation.block_ids import BlockIds
from staticattn.validation.extents import check_extents
from staticattn.validation.host_arrays import (
    screen_step,
    uniform_decode_passes,
    validate_host_step,
)
from staticattn.validation.image_spans import check_image_spans
from staticattn.validation.in_place_views import ViewChecks
from staticattn.validation.replay_start import check_replay_start, replay_start_array
from staticattn.validation.values import check_capacity, count_arg

__all__ = ["CheckedStep", "StepChecks"]


class CheckedStep(NamedTuple):
    """What the checks of a step handed as host arrays found: its shortest and longest
    query, its replay starts (host ints ``(num_reqs,)`` or None) and its image spans
    (checked ``(request, first, last)`` rows or None)."""

    shortest: int
    longest: int
    replay_start: np.ndarray | None
    image_spans: list | None


class StepChecks:
    """Every check of one manager's steps (see the module docstring).

    Parameters
    ----------
    config : ArenaConfig
    host : HostViews
        The staging views an engine writes in place.
    slot_bound : int or None
        Slots must be below it (the KV pool's slots; None: only ``>= -1``).
    block_ids : BlockIds or None
        The block tables against the KV pool of ``block_ids.num_kv_blocks`` blocks (None
        without a pool size).
    validate : bool
        Check every step (else only the extents); switchable.
    """

    def __init__(self, config: ArenaConfig, host, slot_bound: int | None,
                 block_ids: BlockIds | None, validate: bool) -> None:
        self.config = config
        self.validate = validate
        self.slot_bound = slot_bound
        self._num_kv_blocks = None if block_ids is None else block_ids.num_kv_blocks
        # The block ids a validated step uses, where the tables are host memory (a CPU
        # arena; None otherwise: reading a device table would synchronise).
        self._host_blocks = (block_ids if block_ids is not None and block_ids.host_tables
                             else None)
        #: The in-place views' checks (a few vectorized passes over the written prefixes).
        self.views = ViewChecks(host, config, slot_bound, block_ids)
        self._n = config.next_n
        self._span_capacity = config.max_image_spans if config.image_spans else 0

    # ------------------------------------------------------------- host arrays (run)
    def uniform_decode(self, num_reqs: int, seq_lens: np.ndarray,
                       slot_mapping: np.ndarray) -> bool:
        """The replay path of a step of ``num_reqs`` requests whose query lengths are all
        ``next_n`` (the caller has seen that): True when it passes (the pre-screen, or with
        ``validate`` off the extents every kernel needs); False sends the step to
        :meth:`arrays`, which names what is wrong. Host ints ``seq_lens`` ``(num_reqs,)``,
        ``slot_mapping`` ``(num_reqs * next_n,)``."""
        if not self.validate:
            return (seq_lens.ndim == 1 and seq_lens.shape[0] == num_reqs
                    and num_reqs * self._n <= self.config.max_num_batched_tokens)
        if not uniform_decode_passes(num_reqs, seq_lens, slot_mapping, self.config,
                                     self.slot_bound):
            return False
        if self._host_blocks is not None:
            self._host_blocks.check_step(num_reqs, seq_lens)
        return True

    def arrays(self, query_lens: np.ndarray, seq_lens: np.ndarray, slot_mapping: np.ndarray,
               replay_start=None, image_spans=None) -> CheckedStep:
        """A step of any composition handed as host ints (``query_lens``, ``seq_lens``
        ``(num_reqs,)``, ``slot_mapping`` ``(num_tokens,)``; decodes first), with its replay
        starts and image spans in any accepted form; a typed error naming the first bad
        value."""
        q, s, slots, cfg = query_lens, seq_lens, slot_mapping, self.config
        if q.ndim == 1 and q.shape[0] == 0:
            raise InvalidBatchError("a step needs at least one request; got none")
        lengths = screen_step(q, s, slots, cfg, self.slot_bound) if self.validate else None
        if lengths is None:
            if self.validate:
                validate_host_step(q, s, slots, cfg, require_decode_first=True,
                                   num_kv_blocks=self._num_kv_blocks,
                                   decode_threshold=cfg.decode_threshold)
            else:  # the extents still bound every kernel
                check_extents(cfg, q, s, slots, q.shape[0] if q.ndim == 1 else 0,
                              slots.shape[0] if slots.ndim == 1 else 0)
            lengths = int(q.min()), int(q.max())
        if replay_start is not None:
            replay_start = np.asarray(replay_start)
            check_replay_start(cfg, replay_start, q, s)
        spans = check_image_spans(cfg, image_spans, q, s)
        if self._host_blocks is not None and self.validate:
            self._host_blocks.check_step(int(q.shape[0]), s)
        return CheckedStep(*lengths, replay_start, spans)

    # ------------------------------------------------------------- views (launch)
    def decode_views(self, num_reqs: int) -> None:
        """A uniform decode step of ``num_reqs`` requests written into the views."""
        if self.validate:
            self.views.decode(num_reqs)

    def step_views(self, num_reqs: int, num_tokens: int, num_spans: int | None) -> None:
        """A step of any composition written into the views, with ``num_spans`` image spans
        (an int the caller took from :meth:`span_count`, or None: a scan of the block)."""
        if self.validate:
            self.views.step(num_reqs, num_tokens, num_spans)

    def span_count(self, num_spans, uniform: bool = False) -> int:
        """``num_spans`` as an int in ``[0, max_image_spans]``, else its typed error; a
        uniform decode step (``uniform``) carries none."""
        if isinstance(num_spans, bool):
            raise InvalidBatchError(f"num_spans must be an int, got {num_spans!r}")
        try:
            count = operator.index(num_spans)
        except TypeError:
            raise InvalidBatchError(f"num_spans must be an int, got {num_spans!r}") from None
        if count < 0:
            raise InvalidBatchError(f"num_spans={count} must be >= 0")
        if uniform and count:
            raise InvalidBatchError(f"num_spans={num_spans!r}: a uniform decode step "
                                    f"(launch(k)) carries no image spans")
        if count > self._span_capacity:
            if not self._span_capacity:
                raise InvalidBatchError(f"num_spans={count}, but the config has "
                                        f"max_image_tokens=0 (a text model): no spans")
            raise CapacityError(f"num_spans={count} exceeds the capacity "
                                f"max_image_spans={self._span_capacity}")
        return count

    # ------------------------------------------------------------- device-decided lengths
    def device_step(self, num_reqs: int, num_tokens: int,
                    replay_start=None) -> np.ndarray | None:
        """A step whose query starts, lengths and slots a device kernel writes: its request
        count and token bound, and its replay starts (host ints ``(num_reqs,)`` or None,
        returned as an array; only what needs no lengths can be checked)."""
        num_reqs = count_arg("num_reqs", num_reqs)
        num_tokens = count_arg("num_tokens", num_tokens)
        if num_reqs < 1:
            raise InvalidBatchError("a step needs at least one request; got num_reqs=0")
        check_capacity(num_reqs, num_tokens, self.config)
        if replay_start is None:
            return None
        return replay_start_array(self.config, replay_start, num_reqs)

    # ------------------------------------------------------------- settings
    def require_pool(self) -> None:
        """A :class:`GraphError` unless the KV pool's size is known (validation checks
        every slot and block id against it)."""
        if self.slot_bound is None:
            raise GraphError("validation checks slots and block ids against the KV pool: build "
                             "the manager with GraphOptions(num_kv_blocks=...) to switch it on")

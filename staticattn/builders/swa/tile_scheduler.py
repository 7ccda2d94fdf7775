"""FlashMLA tile-scheduler metadata, one holder per present layer type per step (spec §6.8).

FlashMLA's sparse decode schedules its tiles lazily: the first ``flash_mla_with_kvcache``
call with an empty ``FlashMLASchedMeta`` runs its tile scheduler on the device and stores the
result in the holder; later calls with the same holder reuse it. The result depends on the
step's top-k *lengths*, so a holder must live for exactly one step and be shared by all
layers of one type.

Graph safety: the builder makes fresh holders inside ``build_decode``, i.e. inside the
capture, so the scheduler kernel is recorded in the graph and runs again from the current
lengths on every replay. A holder made outside the capture and filled eagerly would freeze a
stale schedule.

When ``flash_mla`` is importable its own ``get_mla_metadata()[0]`` is used; otherwise
:class:`TileSchedulerMeta`, a stand-in with the same fields.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import torch

from staticattn.kernels.runtime.dsa_libs import FLASH_MLA, available, memoised_on_libs, require
from staticattn.model import LAYER_TYPES

__all__ = ["TileSchedulerMeta", "new_tile_scheduler_meta", "renew_tile_scheduler_metas",
           "tile_scheduler_metas"]


@dataclass(slots=True)
class TileSchedulerMeta:
    """An empty tile-scheduler metadata, field for field FlashMLA's ``FlashMLASchedMeta``.

    Attributes
    ----------
    have_initialized : bool
        Set by the first decode call, which runs the scheduler.
    config : object
        The call's shape configuration, recorded by the first call; later calls must match it.
    tile_scheduler_metadata : int32 ``(num_sm_parts, 8)`` or None
    num_splits : int32 ``(batch + 1,)`` or None
    """

    have_initialized: bool = False
    config: Any = None
    tile_scheduler_metadata: torch.Tensor | None = None
    num_splits: torch.Tensor | None = None


@memoised_on_libs
def _holder_factory() -> Callable[[], Any]:
    """FlashMLA's holder factory when :mod:`staticattn.kernels.runtime.dsa_libs` finds a usable
    ``flash_mla`` (whose ``get_mla_metadata()`` returns an empty holder), else
    :class:`TileSchedulerMeta`. Decided once, until
    :func:`~staticattn.kernels.runtime.dsa_libs.forget`."""
    if not available()[FLASH_MLA]:
        return TileSchedulerMeta
    get_mla_metadata = require(FLASH_MLA).get_mla_metadata
    return lambda: get_mla_metadata()[0]


def new_tile_scheduler_meta() -> Any:
    """A fresh, empty tile-scheduler metadata holder (FlashMLA's when available)."""
    return _holder_factory()()


def tile_scheduler_metas(layer_types: Iterable[str], num_decode_tokens: int) -> dict[str, Any]:
    """One fresh holder per present layer type, keyed by the name of every type of
    :data:`~staticattn.model.LAYER_TYPES` that attends a window (what FlashMLA's sparse
    decode serves); absent types, and all types when the step has no decode tokens, map to
    None."""
    scheds: dict[str, Any] = dict.fromkeys(n for n, t in LAYER_TYPES.items() if t.window)
    if num_decode_tokens > 0:
        for layer_type in layer_types:
            scheds[layer_type] = new_tile_scheduler_meta()
    return scheds


def renew_tile_scheduler_metas(scheds: dict[str, Any]) -> None:
    """Replace every holder of ``scheds`` (a metadata's ``tile_scheds``) with a fresh, empty
    one, in place; None entries (absent types) stay None. For whoever hands one metadata
    object to several steps without running the build that makes holders (the recorded
    launches of an eager step): a holder filled by an earlier step's decode call holds that
    step's schedule, which FlashMLA would reuse for other lengths."""
    for name, holder in scheds.items():
        if holder is not None:
            scheds[name] = new_tile_scheduler_meta()

"""DeepSeek V4 attention layer types, from each layer's compress ratio (spec §6.1).

Every layer attends its sliding window; C4A layers also attend indexer-selected entries of a
4x-compressed cache, C128A layers every complete entry of a 128x-compressed cache. Each type
has its own top-k shapes, so FlashMLA plans its tiles per type (see :mod:`.tile_plan`).
"""

from __future__ import annotations

from collections.abc import Iterable

from staticattn.errors import ConfigError

__all__ = ["SWA_ONLY", "C4A", "C128A", "LAYER_TYPES", "layer_type_for", "layer_types_for"]

SWA_ONLY = "swaonly"
C4A = "c4a"
C128A = "c128a"
#: Every layer type, in a fixed order.
LAYER_TYPES = (SWA_ONLY, C4A, C128A)


def layer_type_for(compress_ratio: int) -> str:
    """The layer type of one compress ratio: ``<= 1`` -> "swaonly", 4 -> "c4a", 128 -> "c128a".

    Raises
    ------
    ConfigError
        For any other ratio.

    Examples
    --------
    >>> layer_type_for(1), layer_type_for(4), layer_type_for(128)
    ('swaonly', 'c4a', 'c128a')
    """
    ratio = int(compress_ratio)
    if ratio <= 1:
        return SWA_ONLY
    if ratio == 4:
        return C4A
    if ratio == 128:
        return C128A
    raise ConfigError(
        f"compress ratio {ratio} has no DeepSeek V4 layer type; expected <= 1 (sliding window "
        "only), 4 (C4A) or 128 (C128A)"
    )


def layer_types_for(compress_ratios: Iterable[int]) -> tuple[str, ...]:
    """The distinct layer types of a model, in :data:`LAYER_TYPES` order; a model without
    compress ratios is sliding-window only.

    Examples
    --------
    >>> layer_types_for([128, 4, 4, 1])
    ('swaonly', 'c4a', 'c128a')
    >>> layer_types_for([])
    ('swaonly',)
    """
    present = {layer_type_for(r) for r in compress_ratios} or {SWA_ONLY}
    return tuple(t for t in LAYER_TYPES if t in present)

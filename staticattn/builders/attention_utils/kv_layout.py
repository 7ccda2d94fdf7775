"""Memory layout of a paged KV cache block: "NHD" (tokens, heads, head dim) or "HND"
(heads, tokens, head dim).

Chosen, first match wins, by :func:`set_kv_cache_layout` (code), the environment variable
``STATICATTN_KV_CACHE_LAYOUT`` (user; unset or empty means not set), or the default "NHD".
"""

from __future__ import annotations

import os
from typing import Literal, get_args

from staticattn.errors import ConfigError

__all__ = [
    "KV_CACHE_LAYOUT_ENV", "KVCacheLayout", "get_kv_cache_layout", "is_valid_kv_cache_layout",
    "set_kv_cache_layout",
]

KVCacheLayout = Literal["NHD", "HND"]

#: Environment variable naming the layout when no code override is set.
KV_CACHE_LAYOUT_ENV = "STATICATTN_KV_CACHE_LAYOUT"

_DEFAULT_LAYOUT: KVCacheLayout = "NHD"
_override: KVCacheLayout | None = None


def is_valid_kv_cache_layout(value: object) -> bool:
    """Whether ``value`` is one of the layouts, "NHD" or "HND"."""
    return value in get_args(KVCacheLayout)


def set_kv_cache_layout(layout: KVCacheLayout | None) -> None:
    """Override the layout from code; ``None`` removes the override.

    Raises
    ------
    ConfigError
        ``layout`` is neither None nor a valid layout.
    """
    global _override
    if layout is not None:
        _check(layout, "set_kv_cache_layout")
    _override = layout


def get_kv_cache_layout() -> KVCacheLayout:
    """The layout in force: the override, else ``$STATICATTN_KV_CACHE_LAYOUT``, else "NHD".

    Raises
    ------
    ConfigError
        The environment variable is set to something other than "NHD" or "HND".

    Notes
    -----
    vLLM caches its answer (``lru_cache``), so an override set after the first call is
    silently ignored; this one is read on every call (one dict lookup), so the override and
    the environment always take effect. vLLM falls back to a KV-connector's preference;
    there is no connector here, so the fallback is "NHD".

    Examples
    --------
    >>> set_kv_cache_layout("HND")
    >>> get_kv_cache_layout()
    'HND'
    >>> set_kv_cache_layout(None)
    """
    if _override is not None:
        return _override
    value = os.environ.get(KV_CACHE_LAYOUT_ENV)
    if not value:
        return _DEFAULT_LAYOUT
    return _check(value, KV_CACHE_LAYOUT_ENV)


def _check(value: object, source: str) -> KVCacheLayout:
    if not is_valid_kv_cache_layout(value):
        raise ConfigError(
            f"{source}: KV cache layout {value!r} is not one of {list(get_args(KVCacheLayout))}"
        )
    return value  # type: ignore[return-value]

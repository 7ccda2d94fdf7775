"""KV-cache layout: code override, then STATICATTN_KV_CACHE_LAYOUT, then "NHD"."""

from __future__ import annotations

import pytest

from staticattn.builders import (
    KV_CACHE_LAYOUT_ENV,
    get_kv_cache_layout,
    is_valid_kv_cache_layout,
    set_kv_cache_layout,
)
from staticattn.errors import ConfigError


@pytest.fixture(autouse=True)
def clean(monkeypatch):
    monkeypatch.delenv(KV_CACHE_LAYOUT_ENV, raising=False)
    set_kv_cache_layout(None)
    yield
    set_kv_cache_layout(None)


def test_default_is_nhd():
    assert KV_CACHE_LAYOUT_ENV == "STATICATTN_KV_CACHE_LAYOUT"
    assert get_kv_cache_layout() == "NHD"


def test_environment(monkeypatch):
    monkeypatch.setenv(KV_CACHE_LAYOUT_ENV, "HND")
    assert get_kv_cache_layout() == "HND"
    monkeypatch.setenv(KV_CACHE_LAYOUT_ENV, "")
    assert get_kv_cache_layout() == "NHD"


def test_override_wins_and_is_not_cached(monkeypatch):
    monkeypatch.setenv(KV_CACHE_LAYOUT_ENV, "HND")
    assert get_kv_cache_layout() == "HND"
    set_kv_cache_layout("NHD")
    assert get_kv_cache_layout() == "NHD"
    set_kv_cache_layout(None)
    assert get_kv_cache_layout() == "HND"


def test_bad_environment_value(monkeypatch):
    monkeypatch.setenv(KV_CACHE_LAYOUT_ENV, "nhd")
    match = r"STATICATTN_KV_CACHE_LAYOUT: .*'nhd' .*\['NHD', 'HND'\]"
    with pytest.raises(ConfigError, match=match):
        get_kv_cache_layout()


def test_bad_override_changes_nothing():
    set_kv_cache_layout("HND")
    with pytest.raises(ConfigError, match="'NDH' is not one of"):
        set_kv_cache_layout("NDH")  # type: ignore[arg-type]
    assert get_kv_cache_layout() == "HND"


@pytest.mark.parametrize(("value", "valid"), [
    ("NHD", True), ("HND", True), ("nhd", False), ("", False), (None, False), ("NDH", False),
])
def test_is_valid(value, valid):
    assert is_valid_kv_cache_layout(value) is valid

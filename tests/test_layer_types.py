"""Layer types from compress ratios (spec §6.1) and the per-type tile-plan holders (§6.8)."""

from __future__ import annotations

import sys
import types
from dataclasses import dataclass

import pytest

from staticattn.builders.layer_types import (
    C4A,
    C128A,
    LAYER_TYPES,
    SWA_ONLY,
    layer_type_for,
    layer_types_for,
)
from staticattn.builders.tile_plan import TilePlanHolder, new_tile_plan, tile_plans
from staticattn.errors import ConfigError
from staticattn.kernels import dsa_libs
from staticattn.reference.swa import layer_types as oracle_layer_types


@pytest.mark.parametrize("ratio,expected", [
    (-3, SWA_ONLY), (0, SWA_ONLY), (1, SWA_ONLY), (4, C4A), (128, C128A),
])
def test_layer_type_for(ratio, expected):
    assert layer_type_for(ratio) == expected


@pytest.mark.parametrize("ratio", [2, 3, 8, 64, 127, 256])
def test_unknown_ratio_is_a_config_error(ratio):
    with pytest.raises(ConfigError, match=f"compress ratio {ratio}"):
        layer_type_for(ratio)


@pytest.mark.parametrize("ratios", [
    (), (1,), (4,), (128,), (1, 4), (4, 1), (1, 4, 128), (128, 128, 4, 1, 1), (0, 128),
])
def test_layer_types_for_matches_oracle(ratios):
    got = layer_types_for(ratios)
    assert list(got) == oracle_layer_types(list(ratios))
    assert list(got) == [t for t in LAYER_TYPES if t in got]  # fixed order, no repeats


def test_layer_types_for_rejects_any_unknown_ratio():
    with pytest.raises(ConfigError):
        layer_types_for((1, 4, 16))


# ---------------------------------------------------------------------------- tile plans
@pytest.fixture
def no_flash_mla():
    with dsa_libs.hidden(dsa_libs.FLASH_MLA):
        yield


def test_holder_has_flash_mla_fields(no_flash_mla):
    plan = new_tile_plan()
    assert isinstance(plan, TilePlanHolder)
    assert (plan.have_initialized, plan.config, plan.tile_scheduler_metadata,
            plan.num_splits) == (False, None, None, None)


def test_tile_plans_fresh_per_present_type(no_flash_mla):
    first = tile_plans((SWA_ONLY, C128A), num_decode_tokens=3)
    second = tile_plans((SWA_ONLY, C128A), num_decode_tokens=3)
    assert set(first) == set(LAYER_TYPES)
    assert first[C4A] is None
    for t in (SWA_ONLY, C128A):
        assert isinstance(first[t], TilePlanHolder)
        assert first[t] is not second[t]  # one plan per step, never reused across steps
    assert first[SWA_ONLY] is not first[C128A]  # types never share a plan


def test_tile_plans_all_none_without_decode_tokens(no_flash_mla):
    assert tile_plans(LAYER_TYPES, num_decode_tokens=0) == dict.fromkeys(LAYER_TYPES)


@dataclass
class _FakeSchedMeta:
    have_initialized: bool = False
    config: object = None
    tile_scheduler_metadata: object = None
    num_splits: object = None


def _fake_flash_mla(get_mla_metadata) -> types.ModuleType:
    module = types.ModuleType("flash_mla")
    module.get_mla_metadata = get_mla_metadata
    module.flash_mla_with_kvcache = lambda *a, **k: None
    return module


@pytest.fixture
def fake_flash_mla(monkeypatch):
    """Install a fake ``flash_mla`` (from the returned function's argument) that dsa_libs
    judges as on a CUDA machine; whatever was remembered is forgotten before and after."""

    def install(get_mla_metadata) -> None:
        monkeypatch.setitem(sys.modules, "flash_mla", _fake_flash_mla(get_mla_metadata))
        monkeypatch.setattr(dsa_libs.torch.cuda, "is_available", lambda: True)
        dsa_libs.forget()

    yield install
    dsa_libs.forget()


def test_uses_flash_mla_when_importable(fake_flash_mla):
    calls = []

    def get_mla_metadata(*args, **kwargs):
        calls.append((args, kwargs))
        return _FakeSchedMeta(), None

    fake_flash_mla(get_mla_metadata)
    plans = tile_plans((SWA_ONLY, C4A, C128A), num_decode_tokens=1)
    assert all(isinstance(p, _FakeSchedMeta) for p in plans.values())
    assert len({id(p) for p in plans.values()}) == 3
    assert all(c == ((), {}) for c in calls)


def test_old_flash_mla_api_falls_back(fake_flash_mla):
    def get_mla_metadata(cache_seqlens, num_q_tokens_per_head_k, num_heads_k):  # eager API
        raise AssertionError("never called with arguments")

    fake_flash_mla(get_mla_metadata)
    assert isinstance(new_tile_plan(), TilePlanHolder)

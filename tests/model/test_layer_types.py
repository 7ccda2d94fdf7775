"""The table of layer types and the families' encodings (spec §6.1), and the per-type
tile-scheduler metadata holders (§6.8)."""

from __future__ import annotations

import sys
import types
from dataclasses import dataclass

import pytest

from staticattn.arena import ArenaConfig
from staticattn.builders.swa.tile_scheduler import (
    TileSchedulerMeta,
    new_tile_scheduler_meta,
    tile_scheduler_metas,
)
from staticattn.errors import ConfigError
from staticattn.kernels.runtime import dsa_libs
from staticattn.model import LAYER_TYPES, Cache, Reads, architecture, layer_type
from staticattn.reference.swa import layer_types as oracle_layer_types

SWA_ONLY, C4A, C128A = "swaonly", "c4a", "c128a"
WINDOWED = [n for n, t in LAYER_TYPES.items() if t.window]


@pytest.mark.parametrize("ratio,expected", [
    (0, SWA_ONLY), (1, SWA_ONLY), (4, C4A), (128, C128A),
])
def test_deepseek_v4_encoding(ratio, expected):
    assert architecture("deepseek_v4").layer_type_name(ratio, 0) == expected


@pytest.mark.parametrize("ratio", [-3, 2, 3, 8, 64, 127, 256, "4"])
def test_a_ratio_outside_the_encoding_is_a_config_error_naming_the_layer(ratio):
    with pytest.raises(ConfigError, match=f"layer 5: compress ratio {ratio!r}"):
        architecture("deepseek_v4").layer_type_name(ratio, 5)
    with pytest.raises(ConfigError, match="layer 2: compress ratio"):
        ArenaConfig.deepseek_v4(compress_ratios=(1, 4, ratio), device="cpu")


@pytest.mark.parametrize("ratios", [
    (1,), (4,), (128,), (1, 4), (4, 1), (1, 4, 128), (128, 128, 4, 1, 1), (0, 128),
])
def test_config_layer_types_match_oracle(ratios):
    cfg = ArenaConfig.deepseek_v4(compress_ratios=ratios, device="cpu")
    got = [t.name for t in cfg.layer_types]
    assert got == oracle_layer_types(list(ratios))
    assert got == [n for n in LAYER_TYPES if n in got]  # the table's order, no repeats


def test_the_rows_state_what_each_type_owns_and_reads():
    dsa, swa, c4a, c128a = (layer_type(n) for n in ("dsa", SWA_ONLY, C4A, C128A))
    assert (dsa.compress_ratio, dsa.window, dsa.reads) == (1, False, Reads.TOPK)
    assert (swa.compress_ratio, swa.reads, swa.owns) == (0, Reads.NONE, frozenset())
    assert c4a.owns == {Cache.COMPRESSED_KV, Cache.INDEX_K, Cache.COMPRESSOR_STATE}
    assert Cache.INDEX_K not in c128a.owns and c128a.reads is Reads.ALL
    assert c4a.dcp_sharded and not c128a.dcp_sharded
    assert [c4a.compressed_entries(p) for p in (-1, 0, 2, 3, 7, 8)] == [0, 0, 0, 1, 2, 2]
    assert swa.compressed_entries(1000) == 0
    assert c4a.topk_width(512, 1 << 20) == 512
    assert c128a.topk_width(512, 1 << 20) == 8192 and c128a.topk_width(512, 129) == 128
    with pytest.raises(ConfigError, match="'c3a' is not in the table"):
        layer_type("c3a")


def test_what_the_config_derives_from_the_rows():
    v4, v32 = ArenaConfig.deepseek_v4(device="cpu"), ArenaConfig.deepseek_v32(device="cpu")
    assert (v4.index_compress_ratio, v4.dense_layer_type.name, v4.dense_width) == (4, C128A, 8192)
    assert v4.has_swa and not v32.has_swa
    assert (v32.index_compress_ratio, v32.dense_layer_type, v32.dense_width) == (1, None, 0)
    swa_only = ArenaConfig.deepseek_v4(compress_ratios=(1,), device="cpu")
    assert swa_only.index_layer_type is None and swa_only.dense_width == 0


def test_a_window_without_windowed_layers_is_a_config_error():
    with pytest.raises(ConfigError, match="no layer type of \\['dsa'\\] attends a window"):
        ArenaConfig.deepseek_v32(sliding_window=128, device="cpu")


# ------------------------------------------------------------ tile-scheduler metadata
@pytest.fixture
def no_flash_mla():
    with dsa_libs.hidden(dsa_libs.FLASH_MLA):
        yield


def test_holder_has_flash_mla_fields(no_flash_mla):
    plan = new_tile_scheduler_meta()
    assert isinstance(plan, TileSchedulerMeta)
    assert (plan.have_initialized, plan.config, plan.tile_scheduler_metadata,
            plan.num_splits) == (False, None, None, None)


def test_tile_plans_fresh_per_present_type(no_flash_mla):
    first = tile_scheduler_metas((SWA_ONLY, C128A), num_decode_tokens=3)
    second = tile_scheduler_metas((SWA_ONLY, C128A), num_decode_tokens=3)
    assert list(first) == WINDOWED
    assert first[C4A] is None
    for t in (SWA_ONLY, C128A):
        assert isinstance(first[t], TileSchedulerMeta)
        assert first[t] is not second[t]  # one plan per step, never reused across steps
    assert first[SWA_ONLY] is not first[C128A]  # types never share a plan


def test_tile_plans_all_none_without_decode_tokens(no_flash_mla):
    assert tile_scheduler_metas(WINDOWED, num_decode_tokens=0) == dict.fromkeys(WINDOWED)


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
    module.flash_mla_sparse_fwd = lambda *a, **k: None
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
    scheds = tile_scheduler_metas((SWA_ONLY, C4A, C128A), num_decode_tokens=1)
    present = [scheds.pop(t) for t in (SWA_ONLY, C4A, C128A)]
    assert all(isinstance(p, _FakeSchedMeta) for p in present)
    assert len({id(p) for p in present}) == 3
    assert set(scheds.values()) == {None}  # the types this model lacks
    assert all(c == ((), {}) for c in calls)


def test_old_flash_mla_api_falls_back(fake_flash_mla):
    def get_mla_metadata(cache_seqlens, num_q_tokens_per_head_k, num_heads_k):  # eager API
        raise AssertionError("never called with arguments")

    fake_flash_mla(get_mla_metadata)
    assert isinstance(new_tile_scheduler_meta(), TileSchedulerMeta)

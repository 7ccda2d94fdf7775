"""DeepSeek V4.1's configuration: its ratio encoding apart from V4's, the presets, and the
source-layer rules (docs/spec/deepseek-v41.md §2-§4), each broken rule a ConfigError that
names the layer, raised before anything is allocated."""

from __future__ import annotations

import pytest

from staticattn.arena import ArenaConfig
from staticattn.errors import ConfigError
from staticattn.model import architecture

FLASH = dict(device="cpu")


def _flash(**kw) -> ArenaConfig:
    return ArenaConfig.preset("deepseek-v4.1-flash", **FLASH, **kw)


@pytest.mark.parametrize("ratio,v4,v41", [(0, "swaonly", "swaonly"), (1, "swaonly", "c1a"),
                                          (4, "c4a", None), (2, None, "c2a")])
def test_the_same_ratio_means_another_type_in_each_family(ratio, v4, v41):
    for name, expected in (("deepseek_v4", v4), ("deepseek_v41", v41)):
        family = architecture(name)
        if expected is None:
            with pytest.raises(ConfigError, match=f"layer 3: compress ratio {ratio}"):
                family.layer_type_name(ratio, 3)
        else:
            assert family.layer_type_name(ratio, 3) == expected


def test_flash_preset_layers_and_sources():
    cfg = _flash()
    assert len(cfg.compress_ratios) == 43
    types = [t.name for t in cfg.per_layer_types]
    assert types[:2] == ["swaonly"] * 2 and types[2:20] == ["c2a"] * 18
    assert types[20:40] == ["c1a"] * 20 and types[40:] == ["swaonly"] * 3
    assert [t.name for t in cfg.layer_types] == ["swaonly", "c1a", "c2a"]
    assert [t.name for t in cfg.index_layer_types] == ["c1a", "c2a"]
    src = cfg.sources
    # spec §2.2: c2a 2-7 -> 2, 8-13 -> 8, 14-19 -> 14; c1a 20-39 -> 20.
    assert src.kv_source[2:20] == (2,) * 6 + (8,) * 6 + (14,) * 6
    assert src.kv_source[20:40] == (20,) * 20
    assert src.kv_source[:2] == (None,) * 2 and src.kv_source[40:] == (None,) * 3
    # top-k: 3-7 -> 2, 21-23 -> 20, 25-27 -> 24, 37-39 -> 36.
    assert src.index_source[3:8] == (2,) * 5
    assert src.index_source[21:28] == (20,) * 3 + (24,) * 4
    assert src.index_source[37:40] == (36,) * 3
    assert (cfg.sliding_window, cfg.swa_block_size, cfg.block_size) == (128, 32, 64)
    assert cfg.index_topk == 512
    assert ArenaConfig.preset("deepseek-v4.1-large", **FLASH).index_topk == 1024


def test_several_index_types_need_a_name():
    with pytest.raises(ConfigError, match="IndexerMetadataBuilder\\(layer_type=...\\)"):
        _ = _flash().index_layer_type


@pytest.mark.parametrize("fields,match", [
    (dict(kv_source_layers=(2, 8, 14)), "layer 20 \\(c1a\\) would read kv source 14 \\(c2a\\)"),
    (dict(kv_source_layers=(3, 8, 14, 20)), "layer 2 \\(c2a\\) has no kv source at or below"),
    (dict(kv_source_layers=(8, 2, 14, 20)), "strictly increasing; 8 is followed by 2"),
    (dict(kv_source_layers=(2, 2, 14, 20)), "strictly increasing"),
    (dict(kv_source_layers=(1, 2, 8, 14, 20)), "layer 1 is swaonly, which owns no compressed_kv"),
    (dict(kv_source_layers=(2, 8, 14, 20, 43)), "kv_source_layers\\[4\\] = 43 is not a layer"),
    (dict(kv_source_layers=(-1, 2)), "kv_source_layers\\[0\\] = -1 is not a layer"),
    (dict(index_source_layers=(2, 8, 14, 24)), "layer 20 \\(c1a\\) would read index source 14"),
    (dict(index_source_layers=(2, 8, 14, 20, 41)), "layer 41 is swaonly, which owns no index_k"),
    (dict(index_source_layers=(8, 20)), "layer 2 \\(c2a\\) has no index source"),
    (dict(compress_ratios=(0, 4, 1)), "layer 1: compress ratio 4 is not a deepseek_v41"),
    (dict(compress_ratios=(0, 1, 2), kv_source_layers=(1, 2), index_source_layers=(1,)),
     "layer 2 \\(c2a\\) would read index source 1 \\(c1a\\)"),
    (dict(dcp_world_size=2, cp_kv_cache_interleave_size=1), "sharded compress ratio 2 "
     "\\(layer types \\['c2a'\\]\\)"),
    (dict(dcp_world_size=2, cp_kv_cache_interleave_size=128), "does not divide block_size=64"),
    (dict(sliding_window=None), "attend a sliding window"),
])
def test_broken_rules_are_config_errors_naming_the_layer(fields, match):
    with pytest.raises(ConfigError, match=match):
        _flash(**fields)


def test_without_source_lists_every_compressed_layer_is_its_own_source():
    cfg = _flash(compress_ratios=(0, 2, 2, 1), kv_source_layers=None, index_source_layers=None)
    assert cfg.sources.kv_source == (None, 1, 2, 3)
    assert cfg.sources.index_source == (None, 1, 2, 3)

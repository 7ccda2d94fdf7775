"""The sanity checker and the pytest plugin on a DeepSeek V4.1 arena: the gather consumer
(eight columns: both indexers, both compressed types, the window) captured per batch size
and replayed against eager runs on random steps, every cache group's table drawn."""

from __future__ import annotations

import pytest

from staticattn.arena import ArenaConfig
from staticattn.builders import default_builders, make_arena
from staticattn.checks import check_graph_safety
from staticattn.checks.pytest_plugin import assert_graph_safe
from staticattn.consumers import GatherConsumer

pytestmark = pytest.mark.gpu


def _config(preset: str, next_n: int) -> ArenaConfig:
    return ArenaConfig.preset(preset, max_model_len=16384, max_num_seqs=32,
                              max_num_batched_tokens=128, num_speculative_tokens=next_n - 1,
                              device="cuda")


@pytest.mark.parametrize("preset, next_n", [("deepseek-v4.1-flash", 1),
                                            ("deepseek-v4.1-flash", 2),
                                            ("deepseek-v4.1-large", 2)])
def test_gather_consumer_passes_on_v41(preset, next_n):
    cfg = _config(preset, next_n)
    builders = default_builders(cfg)
    arena, inputs = make_arena(cfg, builders)
    report = check_graph_safety(arena, inputs, builders, GatherConsumer(cfg),
                                sizes=[2 * next_n, 16 * next_n, 32 * next_n], num_batches=50)
    print(report)
    assert report.ok, str(report)
    assert not report.errors and all(f.severity == "note" for f in report.findings)
    assert all(s.replays > 0 and s.mismatches == 0 for s in report.sizes), str(report)


def test_the_plugin_builds_the_v41_default_builders():
    cfg = _config("deepseek-v4.1-flash", 2)
    report = assert_graph_safe(GatherConsumer(cfg), config=cfg, sizes=[4, 32], batches=20)
    assert report.ok

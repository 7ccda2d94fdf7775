"""The gather consumer reads every token's metadata the way attention does: its checksums
equal the oracle's (computed from the step alone) whichever build made the metadata -- the
reference's eager build, the uniform decode build, the mixed build of a token bucket."""

from __future__ import annotations

import numpy as np
import pytest
from helpers.gather_world import consume, gather_world
from helpers.mixed_steps import CONFIGS, bucket_for, stage_mixed
from helpers.support import DEVICE, fuzz_examples, host_steps, make_step, stage
from hypothesis import given, settings

from staticattn.builders import (
    Batch,
)
from staticattn.reference import checksums


def world(name: str, backend: str):
    cfg = CONFIGS[name](device=DEVICE, kernel_backend=backend)
    _, inputs, builders, consumer, caches = gather_world(cfg)
    return cfg, builders, inputs, consumer, caches


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_checksums_match_the_oracle_through_every_build(backend, name):
    cfg, builders, inputs, consumer, caches = world(name, backend)

    @settings(max_examples=fuzz_examples(backend, 40, 2))
    @given(host_steps(cfg, max_seq_len=4096))
    def check(step):
        want = checksums.expected(cfg, step, *caches, step.num_tokens_padded)
        assert consume(consumer, builders, stage(inputs, step), "build") == want
        num_reqs, num_tokens = bucket_for(cfg, step.num_tokens,
                                          np.random.default_rng(step.num_tokens))
        got = consume(consumer, builders, stage_mixed(inputs, step, num_reqs, num_tokens),
                       "build_mixed")
        assert got == checksums.expected(cfg, step, *caches, num_tokens)
        if (step.query_lens == cfg.next_n).all():
            stage(inputs, step)
            inputs.copy_to_device(step.num_reqs_padded, step.num_tokens_padded, uniform=True)
            batch = Batch.for_decode_capture(inputs, step.num_reqs_padded)
            assert consume(consumer, builders, batch, "build_decode") == want

    check()


def test_host_planned_sub_chunks_beyond_one_per_request(backend):
    """A prefill whose keys overflow the logits budget is cut into more query sub-chunks
    than the step has requests; the consumer lays them all out."""
    from helpers.support import make_step

    cfg, builders, inputs, consumer, caches = world("v3.2-n1", backend)
    step = make_step(cfg, [169, 43], [3847, 2273], rng=np.random.default_rng(0))
    batch = stage(inputs, step)
    assert len(builders[0].build(batch).prefill.chunks) > cfg.max_num_seqs + 1
    want = checksums.expected(cfg, step, *caches, step.num_tokens)
    assert consume(consumer, builders, stage(inputs, step), "build") == want


def test_the_consumer_runs_on_the_backend_it_is_given():
    """``backend`` picks the consumer's own kernels, whatever the builders run: a Triton
    world read through the torch kernels gives the Triton consumer's sums; an unknown
    backend is a typed error."""
    from staticattn.consumers import GatherConsumer
    from staticattn.errors import BackendUnavailableError

    cfg = CONFIGS["v4-n2"](device=DEVICE, kernel_backend="triton")
    _, inputs, builders, consumer, _ = gather_world(cfg)
    reader = GatherConsumer(cfg, num_kv_blocks=100_000, backend="torch")
    assert (consumer.backend, reader.backend) == ("triton", "torch")
    step = make_step(cfg, [cfg.next_n, cfg.next_n, 37], [900, 40, 300],
                     rng=np.random.default_rng(3))
    batch = stage(inputs, step)
    metadata = {b.name: b.build(batch) for b in builders}
    assert reader(batch, metadata).tolist() == consumer(batch, metadata).tolist()
    with pytest.raises(BackendUnavailableError, match="unknown kernel backend 'cuda'"):
        GatherConsumer(cfg, backend="cuda")

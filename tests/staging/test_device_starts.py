"""Steps whose query starts, lengths and slots an earlier kernel wrote on the device.

The device-starts staging pads those views in place and derives the rest: over a bucket's
whole extent it must leave exactly what the host-fed staging leaves for the same step (the
views left past the real step by the writer are garbage here, on purpose), and the mixed
builds on it must equal the oracle. Both kernel backends. Then the eager fallback of
:class:`DeviceLengthSteps` (no graphs on a CPU): the producer runs, its lengths are read back
and the reference builds run on them.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from helpers.mixed_steps import CONFIGS, bucket_for, stage_mixed, world
from helpers.support import DEVICE, _t, fuzz_examples, host_steps, quiet
from hypothesis import given, settings
from hypothesis import strategies as st

from staticattn.builders import (
    Batch,
    IndexerMetadataBuilder,
    SparseSWAMetadataBuilder,
    make_arena,
)
from staticattn.builders.indexer.prefill import max_chunks
from staticattn.checks import same_outputs, snapshot_outputs
from staticattn.errors import CapacityError, GraphError, InvalidBatchError
from staticattn.graphs import DeviceLengthSteps, EagerBuild, EagerReason, GraphManager
from staticattn.reference import mixed as oracle


def _staged(inputs, num_reqs: int, num_tokens: int) -> list[torch.Tensor]:
    return [v.clone() for v in (inputs.query_start_loc[: num_reqs + 1],
                                inputs.seq_lens[:num_reqs], inputs.slot_mapping[:num_tokens],
                                inputs.positions[:num_tokens],
                                inputs.token_to_req[:num_tokens], inputs.step_counts,
                                inputs.query_lens[:num_reqs])]


def write_on_device(inputs, step, num_reqs: int, num_tokens: int, seed: int) -> None:
    """What a producer kernel leaves: the step's values, garbage past them."""
    gen = torch.Generator().manual_seed(seed)
    k, nt = step.num_reqs, step.num_tokens
    for view in (inputs.query_start_loc, inputs.seq_lens, inputs.slot_mapping):
        view.copy_(torch.randint(-5, 10_000, view.shape, generator=gen).to(view.dtype))
    qsl = np.concatenate([[0], np.cumsum(step.query_lens)])
    inputs.query_start_loc[: k + 1].copy_(_t(qsl.astype(np.int32)))
    # Starts past k keep growing, as a producer writing all R requests would leave them.
    inputs.query_start_loc[k + 1 : num_reqs + 1].copy_(
        torch.arange(1, num_reqs - k + 1, dtype=torch.int32) * 3 + nt)
    inputs.seq_lens[:k].copy_(_t(step.seq_lens.astype(np.int32)))
    inputs.slot_mapping[:nt].copy_(_t(step.slot_mapping.astype(np.int64)))


@pytest.mark.parametrize("name", ["v3.2-n1", "v4-n2", "v4-n8-flatten"])
def test_device_starts_stage_as_the_host_does_and_match_the_oracle(backend, name):
    cfg, builders, inputs = world(name, backend)

    @settings(max_examples=fuzz_examples(backend, 100, 30))
    @given(host_steps(cfg, max_seq_len=4096), st.integers(0, 2**16))
    def check(step, seed):
        num_reqs, num_tokens = bucket_for(cfg, step.num_tokens, np.random.default_rng(seed))
        stage_mixed(inputs, step, num_reqs, num_tokens)
        want = _staged(inputs, num_reqs, num_tokens)
        write_on_device(inputs, step, num_reqs, num_tokens, seed)
        inputs.stage_device_step(step.num_reqs)
        inputs.copy_to_device(num_reqs, num_tokens, device_starts=True)
        got = _staged(inputs, num_reqs, num_tokens)
        for a, b, what in zip(got, want, ("qsl", "seq_lens", "slots", "positions",
                                          "token_to_req", "step_counts", "query_lens")):
            assert torch.equal(a.cpu(), b.cpu()), what
        batch = Batch.for_mixed_capture(inputs, num_reqs, num_tokens)
        metas = {b.name: b.build_mixed(batch) for b in builders}
        exp = oracle.indexer(cfg, step, num_reqs, num_tokens,
                             max_chunks(cfg, num_reqs, num_tokens))
        oracle.assert_indexer_matches(metas["indexer"], exp, cfg, step)
        if "swa" in metas:
            oracle.assert_swa_matches(metas["swa"], oracle.swa(cfg, step, num_reqs, num_tokens),
                                      cfg, step)

    check()


def test_a_producer_overshooting_the_extent_is_capped(backend):
    """Query starts past the extent ``T``: the real token count is ``T``, nothing past it is
    written, every later start is ``T``."""
    cfg, builders, inputs = world("v4-n2", backend)
    inputs.query_start_loc[:4].copy_(torch.tensor([0, 2, 9, 40], dtype=torch.int32))
    inputs.seq_lens[:3].copy_(torch.tensor([10, 20, 50], dtype=torch.int32))
    before = inputs.slot_mapping[16:].clone()
    inputs.stage_device_step(3)
    inputs.copy_to_device(4, 16, device_starts=True)
    assert inputs.query_start_loc[:5].tolist() == [0, 2, 9, 16, 16]
    assert inputs.step_counts[:2].tolist() == [3, 16]
    assert torch.equal(inputs.slot_mapping[16:], before)


class _Producer:
    """A toy drafter: request ``b`` verifies ``1 + (b + calls) % next_n`` tokens after a
    fixed context; slots are the tokens' positions (the KV pool is flat here)."""

    def __init__(self, cfg, contexts: np.ndarray) -> None:
        self.n, self.calls = cfg.next_n, 0
        self.contexts = torch.as_tensor(contexts, dtype=torch.int64, device=DEVICE)

    def __call__(self, inputs, num_reqs: int, num_tokens: int) -> None:
        b = torch.arange(num_reqs, device=DEVICE)
        q = 1 + (b + self.calls) % self.n
        self.calls += 1
        inputs.query_start_loc[0] = 0
        inputs.query_start_loc[1 : num_reqs + 1].copy_(torch.cumsum(q, 0))
        inputs.seq_lens[:num_reqs].copy_(self.contexts[:num_reqs] + q)
        t = torch.arange(num_tokens, device=DEVICE)
        req = torch.searchsorted(inputs.query_start_loc[1 : num_reqs + 1].long(), t,
                                 right=True).clamp(max=num_reqs - 1)
        start = inputs.query_start_loc[req].long()
        inputs.slot_mapping[:num_tokens].copy_(self.contexts[req] + t - start)


def test_without_graphs_every_step_runs_eagerly_on_the_producers_lengths():
    cfg = CONFIGS["v4-n2"](device=DEVICE, kernel_backend="torch")
    builders = [IndexerMetadataBuilder(), SparseSWAMetadataBuilder()]
    arena, inputs = make_arena(cfg, builders)
    rows = torch.arange(cfg.max_num_seqs * 4, dtype=torch.int32).view(cfg.max_num_seqs, 4)
    inputs.block_table[:, :4].copy_(rows.to(inputs.block_table.device))
    inputs.swa_block_table[:, :4].copy_(rows.to(inputs.swa_block_table.device))
    producer = _Producer(cfg, np.array([30, 7, 100, 64, 5]))
    with GraphManager(arena, inputs, builders, _positions_step, quiet()) as gm:
        steps = DeviceLengthSteps(gm, producer)
        for calls in range(3):
            out = steps.launch(5, 10)
            q, s, slots = steps.read_step(5)
            assert q.tolist() == [1 + (b + calls) % 2 for b in range(5)]
            want = gm.run(q, s, slots, eager=EagerBuild.REFERENCE).outputs
            assert same_outputs(snapshot_outputs(out), snapshot_outputs(want))
        # Three device-length steps without graphs, three forced A/B runs.
        assert gm.stats.eager == {EagerReason.NOT_CAPTURED: 3, EagerReason.FORCED: 3}
        assert gm.stats.replays_total == 0
        for bad, error in (((-1, 4), InvalidBatchError), ((0, 4), InvalidBatchError),
                           ((17, 40), CapacityError),
                           ((2, 10_000), CapacityError)):
            with pytest.raises(error):
                steps.launch(*bad)
        if not torch.cuda.is_available():
            with pytest.raises(GraphError, match="launch\\(\\) still runs every step eagerly"):
                steps.capture()


def _positions_step(batch, metadata):
    """A step whose output per token depends on the staging and both builds."""
    swa = metadata["swa"]
    return torch.stack([batch.positions[: batch.num_actual_tokens],
                        batch.token_to_req[: batch.num_actual_tokens].long(),
                        swa.is_valid_token[: batch.num_actual_tokens].long()], dim=1)

"""The paged-MQA-logits schedule: the worked examples of both remainder rules, random lengths
against the oracle (torch and Triton), and -- on a GPU with DeepGEMM -- bit equality with
``deep_gemm.get_paged_mqa_logits_metadata``."""

from __future__ import annotations

import pytest
import torch
from helpers.support import DEVICE
from hypothesis import given, settings
from hypothesis import strategies as st

from staticattn.kernels.indexer.mqa_schedule import paged_mqa_schedule
from staticattn.reference import indexer as oracle


def _schedule(backend, lens, num_sms, legacy, next_n=1):
    """``lens``: rows of ``n`` ints, passed as a ``(B, n)`` tensor; ``next_n`` only gives the
    width of an empty ``lens`` (``(0, next_n)``), never reshapes rows into more rows."""
    out = torch.full((num_sms + 1, 2), -5, dtype=torch.int32, device=DEVICE)
    width = len(lens[0]) if lens else next_n
    lens = torch.tensor(lens, dtype=torch.int32, device=DEVICE).reshape(len(lens), width)
    paged_mqa_schedule(backend, lens, out, legacy_remainder=legacy)
    return out.tolist()


@pytest.mark.parametrize(
    ("lens", "expected"),
    [
        ([[300], [100], [0]], [[0, 0], [0, 1], [1, 0], [3, 0], [3, 0]]),
        ([[1000], [600], [10]], [[0, 0], [0, 2], [1, 0], [1, 2], [3, 0]]),
        # Example H's (4, 2) lengths: only the last column [10, 7, 12, 0] counts.
        ([[9, 10], [6, 7], [11, 12], [0, 0]], [[0, 0], [1, 0], [2, 0], [4, 0], [4, 0]]),
    ],
)
def test_example_j_legacy_rule(backend, lens, expected):
    assert _schedule(backend, lens, 4, legacy=True) == expected
    assert oracle.mqa_schedule(lens, 4, legacy=True) == expected


def test_deepgemm_v261_example(backend):
    lens = [[1000], [300], [2100]]
    assert _schedule(backend, lens, 4, legacy=False) == [[0, 0], [0, 3], [2, 1], [2, 5], [3, 0]]
    assert _schedule(backend, lens, 4, legacy=True) == [[0, 0], [1, 0], [2, 2], [2, 6], [3, 0]]


def test_all_empty_and_strided_input(backend):
    assert _schedule(backend, [[0, 0]] * 5, 3, legacy=False) == [[5, 0]] * 4
    # A (B, n) view with a longer row stride: only the last column of each row is read.
    base = torch.tensor([[0, 700, 99], [0, 300, 99]], dtype=torch.int32, device=DEVICE)
    out = torch.zeros(3, 2, dtype=torch.int32, device=DEVICE)
    paged_mqa_schedule(backend, base[:, :2], out)
    assert out.tolist() == oracle.mqa_schedule([[0, 700], [0, 300]], 2, legacy=False)


@pytest.mark.parametrize("legacy", [False, True])
@pytest.mark.parametrize("next_n", [1, 2])
def test_no_rows_gives_every_sm_the_sentinel(backend, legacy, next_n):
    """A step without decode tokens: both backends write the end sentinel everywhere."""
    assert _schedule(backend, [], 5, legacy, next_n) == [[0, 0]] * 6
    assert oracle.mqa_schedule([], 5, legacy) == [[0, 0]] * 6


@pytest.mark.parametrize("legacy", [False, True])
@pytest.mark.parametrize("rows, num_sms", [(300, 132), (1100, 7), (257, 300)])
def test_more_rows_than_one_pass_of_the_kernel(backend, rows, num_sms, legacy):
    """Past the Triton kernel's row tile (128) and two tiles (256), and past its chunk of the
    total pass (1024): every row non-zero, so every tile places SMs."""
    lens = [[1 + (b * 7919) % 3000] for b in range(rows)]
    assert _schedule(backend, lens, num_sms, legacy) == oracle.mqa_schedule(lens, num_sms,
                                                                            legacy)


@st.composite
def _cases(draw):
    next_n = draw(st.integers(1, 4))
    batch = draw(st.integers(1, 70))
    top = draw(st.sampled_from([300, 5000, 70_000]))
    lens = [[draw(st.integers(0, top))] * next_n for _ in range(batch)]
    return lens, draw(st.integers(1, 140)), draw(st.booleans())


@pytest.mark.parametrize("backend_name", ["torch", "triton"])
def test_random_lengths_match_oracle(backend_name):
    @settings(max_examples=40 if backend_name == "triton" else 300)
    @given(_cases())
    def check(case):
        lens, num_sms, legacy = case
        assert _schedule(backend_name, lens, num_sms, legacy) == oracle.mqa_schedule(
            lens, num_sms, legacy)

    check()


def _deep_gemm_rule_is_legacy(deep_gemm) -> bool:
    """DeepGEMM v2.1-v2.3 front-load the remainder; v2.4+ give it to the last SMs."""
    parts = str(getattr(deep_gemm, "__version__", "2.6.1")).split(".")
    major, minor = int(parts[0]), int("".join(ch for ch in parts[1] if ch.isdigit()) or 0)
    return (major, minor) < (2, 4)


@pytest.mark.gpu
@pytest.mark.parametrize("next_n", [1, 2])
def test_matches_deep_gemm_bit_for_bit(next_n):
    deep_gemm = pytest.importorskip("deep_gemm")
    legacy = _deep_gemm_rule_is_legacy(deep_gemm)
    gen = torch.Generator().manual_seed(next_n)
    num_sms_here = torch.cuda.get_device_properties(0).multi_processor_count
    for num_sms in (num_sms_here, 7):
        for batch in (1, 3, 31, 32, 33, 100, 257):
            last = torch.randint(0, 70_000, (batch, 1), generator=gen, dtype=torch.int32)
            last[torch.randint(0, batch, (max(1, batch // 5),), generator=gen)] = 0
            lens = (last - next_n + 1 + torch.arange(next_n, dtype=torch.int32)).clamp(min=0)
            lens = lens.contiguous().cuda()
            want = deep_gemm.get_paged_mqa_logits_metadata(lens, 64, num_sms)
            for backend_name in ("triton", "torch"):
                out = torch.empty(num_sms + 1, 2, dtype=torch.int32, device="cuda")
                paged_mqa_schedule(backend_name, lens, out, legacy_remainder=legacy)
                torch.cuda.synchronize()
                assert torch.equal(out, want), (backend_name, num_sms, batch)

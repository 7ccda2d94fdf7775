"""DeepSeek V3.2's real prefill layers under PCP + DCP (``D = P``;
``prefill-context-parallel.md`` §3.5-§3.6): each rank's metadata built on the device from the
staged global batch, its shard of every request's keys in a cache of its own (placed by the
spec's ownership rule, written by the test independently of the package), its rows shared,
all-gathered over the DCP group and used:

* **the indexer** (:class:`~staticattn.distributed.pcp_dcp_indexer.PCPDCPPrefillTopK`):
  deinterleaved and scored -- every prefill token gets the single-GPU oracle's top-k;
* **the sparse-MLA prefill** (:class:`~staticattn.distributed.pcp_dcp_sparse_mla.
  PCPDCPSparseMLAPrefill`): dequantised and attended -- every prefill token gets the
  single-GPU oracle's attention over its top-k keys (-1 padding and positions past the token
  among them);
* **the whole attention** (:class:`~staticattn.distributed.pcp_dcp_attention.
  PCPDCPSparseAttention`): the indexer's top-k feeding the sparse-MLA prefill -- every
  prefill token's top-k is the oracle's (up to tied logits) and its attention the oracle's
  over that top-k: the single-GPU step's.

For interleave 1 and one that splits a request into runs, with MTP decode rows in front;
decode tokens' rows are left alone (the indexer's say "no key"). Every rank in one process
(the all-gather played by copying rows; the libraries' kernels emulated on CPU, the real ones
on CUDA), gloo ranks running the layer whole in their step, and NCCL ranks replaying it in
their graphs."""

from __future__ import annotations

import functools

import pytest
import torch
from helpers import dcp_workers
from helpers import pcp_dcp_attention as attention
from helpers import pcp_dcp_indexer as indexer
from helpers import pcp_dcp_ranks as ranks_of
from helpers import pcp_dcp_sparse_mla as sparse_mla
from helpers.dsa_reference import emulated_mqa_logits
from helpers.sparse_mla_reference import emulated_sparse_fwd

from staticattn.consumers.real.caches import alloc_ds_mla_cache, alloc_indexer_cache
from staticattn.distributed.pcp_dcp_indexer import PCPDCPPrefillTopK
from staticattn.distributed.pcp_dcp_sparse_mla import PCPDCPSparseMLAPrefill
from staticattn.distributed.pcp_rank import PCPRank
from staticattn.distributed.pcp_world import PCPSizes, configs
from staticattn.errors import ConfigError
from staticattn.kernels.runtime.dsa_libs import import_error

SETTINGS = {"indexer": indexer, "sparse-mla": sparse_mla, "attention": attention}
#: (world, interleave, device, speculative tokens): single-module MTP's decode rows of 1 or
#: 2 tokens put more decode tokens than decode rows before the prefill tokens.
SHAPES = [(2, 1, "cpu", 0), (2, 16, "cpu", 0), (4, 1, "cpu", 0), (2, 1, "cpu", 1),
          (2, 16, "cuda", 0), (4, 1, "cuda", 0), (2, 1, "cuda", 1)]


def _missing(setting) -> str:
    """Why the setting's real kernels cannot run here ("" when they can)."""
    return "; ".join(filter(None, (import_error(lib) for lib in setting.LIBRARIES)))


def _cuda(setting) -> list:
    error = _missing(setting)
    return [pytest.mark.gpu,
            pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
            pytest.mark.skipif(bool(error), reason=error)]


#: The whole attention composes the two: fewer shapes.
WHOLE = [(2, 16, "cpu", 0), (2, 1, "cpu", 1), (4, 1, "cuda", 0), (2, 1, "cuda", 1)]
CASES = [pytest.param(name, *shape, marks=_cuda(setting) if shape[2] == "cuda" else [])
         for name, setting in SETTINGS.items()
         for shape in (WHOLE if name == "attention" else SHAPES)]


@pytest.mark.parametrize("layer,world,interleave,device,speculative", CASES)
def test_every_rank_prefill_token_gets_the_single_gpu_rows(layer, world, interleave, device,
                                                           speculative):
    """One process plays every rank (on CUDA: one GPU, the library's kernel)."""
    steps, checked = ranks_of.play_in_process(
        SETTINGS[layer], world, interleave, device,
        seed=world * 100 + interleave + 7 * speculative, speculative=speculative)
    drafts = sum(n > 1 and not pre for step in steps
                 for n, pre in zip(step["s"]["query_lens"], step["s"]["is_prefilling"]))
    assert drafts > 0 or not speculative, "no decode row of more than one token"
    # The indexer counts the tokens with more keys than the top-k: a choice was made.
    assert checked > 0, "no prefill token checked"


@pytest.mark.parametrize("layer", list(SETTINGS))
def test_gloo_ranks_run_the_layer_in_their_step(tmp_path, layer):
    """Each rank a process, the layer its ``PCPRank``'s: the rank's rows built from the
    staged global batch, then share, the all-gather over gloo, the layer's finish -- in two
    groups of two ranks side by side, each with steps of its own (a collective over every
    process would mix them)."""
    target = functools.partial(ranks_of.rank_steps, setting=SETTINGS[layer].__name__,
                               world=2, interleave=4, seed=11, groups=2)
    ranks_of.check_records(dcp_workers.spawn_ranks(target, tmp_path, 4))


@pytest.mark.multigpu
@pytest.mark.parametrize("speculative", [0, 1])
@pytest.mark.parametrize("layer", list(SETTINGS))
def test_nccl_ranks_replay_the_layer_in_their_graph(tmp_path, layer, speculative):
    """One GPU a rank: the rank's graph holds the split, the builds and the layer (the
    library's kernel, the all-gather over NCCL)."""
    if torch.cuda.device_count() < 2:
        pytest.skip("needs 2 GPUs (NCCL takes one GPU per rank); the gloo run covers CPU")
    if _missing(SETTINGS[layer]):
        pytest.skip(_missing(SETTINGS[layer]))
    target = functools.partial(ranks_of.rank_steps, setting=SETTINGS[layer].__name__,
                               world=2, interleave=4, seed=208 if speculative else 11,
                               device="cuda", speculative=speculative)
    records = dcp_workers.spawn_ranks(target, tmp_path, 2)
    ranks_of.check_records(records)
    assert all(r["graph"] for r in records)


#: Each layer made on a rank without DCP.
WITHOUT_DCP = {
    "indexer": lambda cfg, views: PCPDCPPrefillTopK(
        cfg, views, kv_cache=alloc_indexer_cache(64, 32, "cpu"), q=torch.zeros(64, 32, 32),
        weights=torch.zeros(64, 32), topk=64, logits_fn=emulated_mqa_logits),
    "sparse-mla": lambda cfg, views: PCPDCPSparseMLAPrefill(
        cfg, views, kv_cache=alloc_ds_mla_cache(64, "cpu"),
        q=torch.zeros(64, 64, 576, dtype=torch.bfloat16), topk=128,
        sparse_fwd_fn=emulated_sparse_fwd),
}


@pytest.mark.parametrize("layer", list(WITHOUT_DCP))
def test_a_rank_without_dcp_is_refused(layer):
    pcp, rank_cfg, _ = configs("deepseek-v3.2", 2, "cpu", PCPSizes(max_model_len=512))
    rank = PCPRank(pcp, rank_cfg, 64, 96, None, 0, 64)
    with pytest.raises(ConfigError, match="DCP group"):
        WITHOUT_DCP[layer](rank_cfg, rank.views)

"""The per-rank bodies of the multi-process DCP tests (``distributed/test_dcp_gloo.py``): each runs
in its own process, joined to a gloo group over a file store, and writes what it saw to
``<out>/rank<r>.json`` for the parent to check; :func:`spawn_ranks` starts them (the PCP
tests' bodies too) and reads the records."""

from __future__ import annotations

import faulthandler
import gc
import json
import os
import time
import traceback
from datetime import timedelta
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

WORLD = 2
#: No run of CPU ranks takes this long; past it the ranks are hung, and the test fails
#: instead of hanging the suite.
SPAWN_TIMEOUT_S = 300
#: When a rank still running writes its stacks (:func:`run`): where a stalled run waits
#: (``STATICATTN_STACK_DUMP_S`` sets it, for a run under a shorter limit of its own).
STACK_DUMP_S = int(os.environ.get("STATICATTN_STACK_DUMP_S", "150"))
STEPS = 40
CONSUMER_STEPS = 30


def config(rank: int, world: int = WORLD):
    from staticattn.arena import ArenaConfig

    return ArenaConfig(
        max_num_seqs=8, max_num_batched_tokens=128, max_model_len=2048, block_size=256,
        num_speculative_tokens=1, architecture="deepseek_v4", compress_ratios=(1, 4, 128),
        sliding_window=16, swa_block_size=16, num_sms=5, max_prefill_workspace=600,
        max_logits_bytes=4 * 6_000, dcp_world_size=world, dcp_rank=rank,
        cp_kv_cache_interleave_size=4, device="cpu", kernel_backend="torch",
    )


def random_step(cfg, rng: np.random.Generator, num_reqs: int | None = None):
    """A decode-first step of ``num_reqs`` requests (random when None): decodes of 1..next_n
    tokens, then a few prefills and extends."""
    from helpers.support import make_step

    n = cfg.next_n
    num_reqs = int(rng.integers(1, cfg.max_num_seqs + 1)) if num_reqs is None else num_reqs
    num_decodes = int(rng.integers(0, num_reqs + 1))
    q = [int(rng.integers(1, n + 1)) for _ in range(num_decodes)]
    budget = cfg.max_num_batched_tokens - sum(q) - (num_reqs - num_decodes)
    for _ in range(num_reqs - num_decodes):
        extra = int(rng.integers(0, max(budget // 2, 0) + 1))
        budget -= extra
        q.append(n + 1 + extra)
    while sum(q) > cfg.max_num_batched_tokens:
        q.pop()
    seq = [int(rng.integers(qi, cfg.max_model_len + 1)) for qi in q]
    return make_step(cfg, q, seq, rng=rng)


def _join(rank: int, out: str, world: int = WORLD, backend: str = "gloo") -> None:
    dist.init_process_group(backend, init_method=f"file://{out}/store", rank=rank,
                            world_size=world, timeout=timedelta(seconds=60))


def join_group(rank: int, out: str, world: int, device: str = "cpu") -> str:
    """Join the run's group over ``out``'s file store: gloo on ``device`` "cpu", NCCL on
    "cuda" (one GPU a rank); returns the rank's device. On CUDA the rank's GPU is made
    current first and the communicator is created here, on it, as a torchrun launch does
    (``distributed.world.join``): not lazily by the first collective, which may run on
    a side stream during a warm-up before a capture."""
    if device == "cpu":
        _join(rank, out, world)
        return device
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", init_method=f"file://{out}/store", rank=rank,
                            world_size=world, timeout=timedelta(seconds=60),
                            device_id=torch.device("cuda", rank))
    return f"cuda:{rank}"


def leave_group() -> None:
    """Destroy the run's group once the caller has dropped what holds it (arenas, consumers,
    captured graphs): collect those first and let the device finish, as the launch's own
    ``distributed.world.leave`` does. An NCCL communicator destroyed while a CUDA graph that
    captured its collectives is still alive may wait forever."""
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    dist.destroy_process_group()


def _write(out: str, rank: int, record: dict) -> None:
    with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
        json.dump(record, f)


def consistent_steps(rank: int, out: str, world: int = WORLD, steps: int = STEPS) -> None:
    """Every rank builds the same random steps; rank r's decode and slot outputs, gathered
    to every rank, go to the parent, which checks them against the oracle."""
    from helpers.support import stage
    from staticattn.builders import make_arena
    from staticattn.builders.indexer.builder import IndexerMetadataBuilder
    from staticattn.builders.swa.builder import SparseSWAMetadataBuilder
    from staticattn.validation.dcp_step import check_dcp_step

    _join(rank, out, world)
    cfg = config(rank, world)
    indexer, swa = IndexerMetadataBuilder(), SparseSWAMetadataBuilder()
    _, inputs = make_arena(cfg, [indexer, swa])
    rng = np.random.default_rng(1234)  # the same seed on every rank: the same steps
    record = {"steps": []}
    for _ in range(steps):
        step = random_step(cfg, rng)
        check_dcp_step(cfg, step.query_lens, step.seq_lens, timeout=timedelta(seconds=20))
        batch = stage(inputs, step)
        meta = indexer.build(batch)
        swa_meta = swa.build(batch)
        mine = {
            "slot_mapping": meta.slot_mapping.tolist(),
            "decode_seq_lens": None if meta.decode is None else meta.decode.seq_lens.tolist(),
            "decode_global": (None if meta.decode is None
                              else meta.decode.global_seq_lens.tolist()),
            "chunks": [[c.local_cu_seq_lens.tolist(), c.cu_seqlen_ks.tolist(),
                        c.cu_seqlen_ke.tolist(), c.local_total_seq_lens,
                        c.max_local_total_seq_lens]
                       for c in (meta.prefill.chunks if meta.prefill else [])],
            "swa": swa_meta.decode_swa_indices.tolist(),
        }
        every = [None] * world
        dist.all_gather_object(every, mine)
        record["steps"].append({"query_lens": step.query_lens.tolist(),
                                "seq_lens": step.seq_lens.tolist(),
                                "block_table": step.block_table.tolist(), "ranks": every})
    dist.destroy_process_group()
    _write(out, rank, record)


def _check_step(rank: int, out: str, cfg, query_lens, seq_lens) -> None:
    """Join, run the cross-rank step check on this rank's step, record what happened."""
    from staticattn.validation.dcp_step import check_dcp_step

    _join(rank, out)
    record = {"staged": False}
    try:
        check_dcp_step(cfg, query_lens, seq_lens, timeout=timedelta(seconds=20))
        record["staged"] = True  # the engine would stage and launch here
    except Exception as exc:  # noqa: BLE001 - the parent checks the type
        record["error"] = type(exc).__name__
        record["message"] = str(exc)
    dist.destroy_process_group()
    _write(out, rank, record)


def mismatched_steps(rank: int, out: str) -> None:
    """Rank 0 is handed 3 requests, rank 1 four: each must raise the typed error from the
    check, before anything is staged."""
    cfg = config(rank)
    step = random_step(cfg, np.random.default_rng(7), num_reqs=3 + rank)
    _check_step(rank, out, cfg, step.query_lens, step.seq_lens)


def mismatched_lengths(rank: int, out: str) -> None:
    """The same request and token counts, one sequence length off by one on rank 1."""
    cfg = config(rank)
    step = random_step(cfg, np.random.default_rng(7), num_reqs=4)
    seq_lens = step.seq_lens.copy()
    seq_lens[-1] += rank
    _check_step(rank, out, cfg, step.query_lens, seq_lens)


def duplicate_rank(rank: int, out: str) -> None:
    """Both processes were configured as dcp_rank 0."""
    cfg = config(0)
    step = random_step(cfg, np.random.default_rng(7), num_reqs=4)
    _check_step(rank, out, cfg, step.query_lens, step.seq_lens)


def wrong_world(rank: int, out: str) -> None:
    """A config for 4 ranks in a group of 2."""
    cfg = config(rank).replace(dcp_world_size=4)
    step = random_step(cfg, np.random.default_rng(7), num_reqs=4)
    _check_step(rank, out, cfg, step.query_lens, step.seq_lens)


def silent_rank(rank: int, out: str) -> None:
    """Rank 1 never joins the check (it failed earlier); rank 0 must get the typed error
    within its timeout, not hang."""
    from staticattn.validation.dcp_step import check_dcp_step

    _join(rank, out)
    cfg = config(rank)
    record = {}
    if rank == 1:
        time.sleep(8)
    else:
        step = random_step(cfg, np.random.default_rng(7))
        start = time.monotonic()
        try:
            check_dcp_step(cfg, step.query_lens, step.seq_lens, timeout=timedelta(seconds=2))
        except Exception as exc:  # noqa: BLE001 - the parent checks the type
            record["error"] = type(exc).__name__
        record["waited_s"] = time.monotonic() - start
    _write(out, rank, record)
    os._exit(0)  # the group is broken on purpose: skip its teardown


def _managed_worlds(runs) -> tuple[list, list]:
    """The DCP demo's world of each ``(config, group)`` (``distributed.world.dcp_world``) and
    a graph manager of it, each over its own pool: a world-1 run's slots address the whole
    (unsharded) pool."""
    from staticattn.distributed.world import dcp_world, graph_pool_blocks
    from staticattn.graphs import GraphManager, GraphOptions

    worlds = [dcp_world(cfg, group) for cfg, group in runs]
    managers = [GraphManager(arena, inputs, builders, consumer,
                             GraphOptions(progress=False, num_kv_blocks=graph_pool_blocks(cfg)))
                for (arena, inputs, builders, consumer), (cfg, _) in zip(worlds, runs)]
    return worlds, managers


def consumer_steps(rank: int, out: str) -> None:
    """Every rank runs the same random decode steps (the DCP demo's,
    ``distributed.world.random_decode_step``) through its own metadata build and the DCP
    consumer (gloo collectives); rank 0 also runs them at world 1 (the single-GPU step).
    Each records its top-k ids and outputs."""
    from staticattn.distributed.world import random_decode_step, write_decode_step

    _join(rank, out)
    runs = [(config(rank), dist.group.WORLD)]
    if rank == 0:
        runs.append((config(0).replace(dcp_world_size=1), None))
    worlds, managers = _managed_worlds(runs)
    record = {"steps": []}
    rng = np.random.default_rng(4321)  # the same seed on every rank: the same steps
    for _ in range(CONSUMER_STEPS):
        step = random_decode_step(config(rank), rng)
        results = []
        for (_, inputs, _, consumer), gm in zip(worlds, managers):
            write_decode_step(inputs, consumer, step)
            ids, att = gm.run(step["query_lens"], step["seq_lens"], step["slot_mapping"]).outputs
            results.append({"ids": ids.tolist(), "out": att.tolist()})
        record["steps"].append(results)
    dist.destroy_process_group()
    _write(out, rank, record)


V41_PRESET = "deepseek-v4.1-flash"
V41_STEPS = 10
V41_SEED = 2468


def v41_consumer_steps(rank: int, out: str) -> None:
    """The DCP demo's DeepSeek V4.1 world (``distributed.world``: both indexers, the
    compressed builder, a consumer per index type) on every rank for the same random decode
    steps, and on each rank the single-process step beside it; each records both steps'
    outputs and its compressed slot mappings of each step."""
    from staticattn.distributed.world import dcp_config, random_decode_step, write_decode_step

    _join(rank, out)
    runs = [(dcp_config(V41_PRESET, WORLD, rank, "cpu"), dist.group.WORLD),
            (dcp_config(V41_PRESET, 1, 0, "cpu"), None)]
    worlds, managers = _managed_worlds(runs)
    record = {"steps": []}
    rng = np.random.default_rng(V41_SEED)  # the same seed on every rank: the same steps
    for _ in range(V41_STEPS):
        step = random_decode_step(runs[0][0], rng, num_reqs=int(rng.integers(1, 9)))
        nt = len(step["slot_mapping"])
        results = []
        for (arena, inputs, _, consumer), gm in zip(worlds, managers):
            write_decode_step(inputs, consumer, step)
            res = gm.run(step["query_lens"], step["seq_lens"], step["slot_mapping"])
            results.append({
                "outputs": [x.tolist() for x in res.outputs],
                "slots": {t: arena[f"compressed.{t}.slot_mapping"][:nt].tolist()
                          for t in ("c1a", "c2a")}})
        record["steps"].append({"seq_lens": step["seq_lens"].tolist(), "runs": results})
    dist.destroy_process_group()
    _write(out, rank, record)


MERGE_TOPK = 8


def merge_rows(rng: np.random.Generator) -> list[list[float]]:
    """A prefill chunk's rows of global scores (a few values: ties), then a decode row."""
    rows = [rng.integers(-3, 6, size=int(rng.integers(0, 40))).astype(float).tolist()
            for _ in range(int(rng.integers(1, 6)))]
    return rows + [rng.normal(size=int(rng.integers(0, 30))).tolist()]


def topk_merge_rows(rank: int, out: str, device: str = "cpu") -> None:
    """Every rank ranks the keys it holds of the same random rows (chunk-wide logits with
    row starts, as a prefill chunk's) and merges through :class:`DCPTopKMerge` (gloo on
    CPU, NCCL with ``device="cuda"``: one GPU per rank); records the merged ids."""
    from staticattn.consumers.dcp.merge import DCPTopKMerge
    from staticattn.reference import dcp_topk as oracle

    device = join_group(rank, out, WORLD, device)
    cfg = config(rank).replace(device=device)
    interleave = cfg.cp_kv_cache_interleave_size // cfg.index_compress_ratio
    merge = DCPTopKMerge(cfg, dist.group.WORLD, topk=MERGE_TOPK, local_k=MERGE_TOPK,
                         max_rows=8)
    rng = np.random.default_rng(99)  # the same rows on every rank
    record = {"ids": []}
    for _ in range(20):
        rows = merge_rows(rng)
        held = [[r[x] for x in oracle.local_keys(len(r), WORLD, rank, interleave)]
                for r in rows]
        starts = [sum(len(h) for h in held[:i]) for i in range(len(rows))]
        logits = torch.zeros(len(rows), max(1, sum(len(h) for h in held)))
        for i, h in enumerate(held):
            logits[i, starts[i]: starts[i] + len(h)] = torch.tensor(h)
        tops = torch.tensor([oracle.exact_topk(h, MERGE_TOPK) for h in held])
        ids = merge(tops.to(device), logits.to(device), torch.tensor(starts, device=device))
        record["ids"].append(ids.tolist())
    dist.destroy_process_group()
    _write(out, rank, record)


def run(rank: int, target, out: str) -> None:
    """Spawn entry: run ``target`` and leave a traceback for the parent on failure; a rank
    still running :data:`STACK_DUMP_S` after its start writes every thread's stack to
    ``<out>/rank<r>.stack`` (once; it runs on), which the parent shows if the run stalls."""
    with open(os.path.join(out, f"rank{rank}.stack"), "w") as stacks:
        faulthandler.dump_traceback_later(STACK_DUMP_S, file=stacks)
        try:
            torch.set_num_threads(1)
            target(rank, out)
        except BaseException:
            _write(out, rank, {"crash": traceback.format_exc()})
            raise
        finally:
            faulthandler.cancel_dump_traceback_later()


def _start_method() -> str:
    """Without CUDA the ranks start from a fork server that has imported torch and the
    package once (it has run nothing: no thread pool to inherit), so a rank does not pay
    the imports, seconds on a small machine, every time. With CUDA they are spawned: a
    preloaded module may touch the CUDA runtime, which a forked child cannot use."""
    if torch.cuda.is_available():
        return "spawn"
    import multiprocessing

    multiprocessing.set_forkserver_preload([
        "torch", "torch.distributed", "numpy", "triton", "staticattn.builders",
        "staticattn.graphs", "staticattn.distributed.pcp_world", "helpers.dcp_workers",
        "helpers.pcp_workers"])
    return "forkserver"


def spawn_ranks(target, tmp_path: Path, world: int = WORLD) -> list[dict]:
    """Run ``target(rank, out)`` on ``world`` spawned ranks (through :func:`run`); each
    rank's record, after checking none crashed. A run past :data:`SPAWN_TIMEOUT_S` fails."""
    context = mp.start_processes(run, args=(target, str(tmp_path)), nprocs=world, join=False,
                                 start_method=_start_method())
    deadline = time.monotonic() + SPAWN_TIMEOUT_S
    while not context.join(timeout=1):
        if time.monotonic() > deadline:
            for process in context.processes:
                process.kill()
            stacks = "\n".join(f"rank {r}'s stacks at {STACK_DUMP_S} s:\n"
                                + (tmp_path / f"rank{r}.stack").read_text()
                                for r in range(world) if (tmp_path / f"rank{r}.stack").exists())
            pytest.fail(f"the {world} ranks did not finish in {SPAWN_TIMEOUT_S} s\n{stacks}")
    records = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(world)]
    for r, record in enumerate(records):
        assert "crash" not in record, f"rank {r}:\n{record['crash']}"
    return records


def check_records(records: list[dict], count: str = "tokens", every: bool = True) -> None:
    """Every rank's steps without a problem (``record["problems"]``), and work done:
    ``record[count]`` above 0 on every rank (``every``), or on some rank."""
    for p, record in enumerate(records):
        assert record["problems"] == [], (p, record["problems"])
    done = [r[count] > 0 for r in records]
    assert all(done) if every else any(done), done

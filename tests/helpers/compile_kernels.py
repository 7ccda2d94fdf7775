"""Compile every Triton kernel of staticattn for sm_90 without a GPU (run as a script), and
check that the SWA kernel's incremental row writers keep their barriers.

Each case names a kernel and example arguments: a torch dtype stands for a pointer of that
element type, an int for a runtime scalar, and the constexprs are given by value. The
signature is derived from them, so a kernel's new argument only needs a new example.
Exit code 77: this Triton has no ahead-of-time compile API.
"""

from __future__ import annotations

import sys

try:
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
except ImportError:
    sys.exit(77)

import torch

from staticattn.consumers.emulated import (
    compressed_checksums,
    dense_prefill_checksums,
    gather_checksums,
)
from staticattn.kernels.compressed import entry_boundary
from staticattn.kernels.compressed import kv_slots as compressed_kv
from staticattn.kernels.compressed import topk_operand as compressed_topk
from staticattn.kernels.dcp import rank_shares as dcp_shares
from staticattn.kernels.indexer import indexer_kernel, mqa_schedule
from staticattn.kernels.indexer import prefill_plan as indexer_plan
from staticattn.kernels.indexer import prefill_ranges as indexer_prefill
from staticattn.kernels.indexer import short_topk_fill as short_topk
from staticattn.kernels.staging import stage_inputs as staging
from staticattn.kernels.swa import combined_rows as swa_combined
from staticattn.kernels.swa import decoder_replay_rows as swa_replay
from staticattn.kernels.swa import dense_prefill_rows as swa_dense_prefill
from staticattn.kernels.swa import draft_rows as swa_draft
from staticattn.kernels.swa import flashinfer_rows as swa_flashinfer
from staticattn.kernels.swa import prefill_gather as swa_prefill
from staticattn.kernels.swa import swa_rows as swa_decode

I32, I64, B = torch.int32, torch.int64, torch.bool
_TYPES = {torch.int32: "*i32", torch.int64: "*i64", torch.bool: "*i1", torch.float32: "*fp32"}


def compile_sm90(kernel, args: dict, constexprs: dict) -> None:
    signature = {}
    for name in kernel.arg_names:
        if name in constexprs:
            signature[name] = "constexpr"
        elif isinstance(args[name], torch.dtype):
            signature[name] = _TYPES[args[name]]
        else:
            signature[name] = "i32"
    src = ASTSource(fn=kernel, signature=signature, constexprs=constexprs)
    return triton.compile(src, target=GPUTarget("cuda", 90, 32))


def incremental_writers(kernel, constexprs: dict) -> int:
    """How many writers of the SWA kernel rewrite a row only up to its old length (each
    must put a barrier between every warp's load of the old lengths and the store of the
    new ones, or a late warp reads a new length and leaves the old row's tail): C128A
    decode rows and paged prefill SWA rows, C128A prefill rows in the chunk kernel. 0 for
    other kernels."""
    if kernel.fn.__name__ == "dense_prefill_chunk_kernel":
        return 1
    if kernel.fn.__name__ != "swa_decode_kernel":
        return 0
    return constexprs["HAS_DENSE"] + constexprs["SWA_PREFILL"]


def ptrs(names: str, dtype) -> dict:
    return dict.fromkeys(names.split(), dtype)


def cases():
    dcp_args = dict.fromkeys("dcp_world dcp_rank dcp_interleave".split(), 1)
    decode = {**ptrs("qsl seq_lens block_table decode_lens decode_seq_lens table_out tiles "
                     "counts token_to_req global_seq_lens", I32),
              **ptrs("positions slots_out own_slots", I64), "replay_start": I32,
              **dict.fromkeys(
                  "bt_stride table_stride tiles_stride num_decodes num_rows width num_cols "
                  "col_blocks compress_ratio storage_bs num_slot_tokens window".split(), 1),
              **dcp_args}
    for flatten in (True, False):
        for slots in (True, False):
            for device_counts in (True, False):
                for dcp in (True, False):
                    yield indexer_kernel._decode_kernel(), decode, dict(
                        DECODE=True, FLATTEN=flatten, SLOTS=slots,
                        DEVICE_COUNTS=device_counts, DCP=dcp, GATE=slots and not dcp,
                        REPLAY=slots and device_counts and not dcp, BLOCK=128, COLS=64)
    for dcp, gate in ((True, False), (False, False), (False, True)):
        yield indexer_kernel._decode_kernel(), {**decode, "seq_lens": I64}, dict(
            DECODE=False, FLATTEN=False, SLOTS=True, DEVICE_COUNTS=False, DCP=dcp, GATE=gate,
            REPLAY=gate, BLOCK=128, COLS=64)
    for legacy in (True, False):
        yield mqa_schedule._schedule_kernel(), {
            "lens": I32, "out": I32, **dict.fromkeys(
                "row_stride last_col batch num_sms atoms".split(), 1)}, dict(
            LEGACY=legacy, SPLIT=256, SM_BLOCK=256, CHUNK=1024, ROWS=128, SMS_STEP=16)
    for dcp in (True, False):
        yield indexer_prefill._chunk_kernel(), {
            **ptrs("qsl seq_lens cu_seq_lens local_cu_seq_lens ks_out ke_out", I32),
            "start": 1, "compress_ratio": 1, **dcp_args}, dict(DCP=dcp, BLOCK=256)
        yield indexer_plan._plan_kernel(), {
            **ptrs("qsl seq_lens token_to_req counts chunk_bounds num_chunks_out cu_seq_lens "
                   "req_key_start ks_out ke_out local_cu_seq_lens local_req_key_start", I32),
            "positions": I64, **dcp_args, **dict.fromkeys(
                "num_reqs num_tokens max_chunks compress_ratio workspace budget".split(),
                1)}, dict(DCP=dcp, BLOCK=1024, FIELDS=8)
    yield staging._uniform_kernel(), {
        **ptrs("host_seq_lens host_counts qsl_out seq_lens_out token_to_req_out counts_out "
               "query_lens_out", I32), **ptrs("host_slots slots_out positions_out", I64),
        "num_reqs": 1,
        "query_len": 1}, dict(BLOCK=256, NUM_COUNTS=4)
    for span_entries in (0, 64 * 3):  # text models; 64 image spans
        yield staging._copy_kernel(), {
            **ptrs("host_qsl host_seq_lens host_counts qsl_out seq_lens_out counts_out "
                   "host_spans spans_out", I32),
            **ptrs("host_slots slots_out", I64), "num_reqs": 1, "num_tokens": 1}, dict(
            SPAN_ENTRIES=span_entries, BLOCK_SPANS=max(256, span_entries), BLOCK=256)
    yield staging._derive_kernel(), {
        **ptrs("qsl seq_lens token_to_req_out counts query_lens_out", I32),
        "positions_out": I64,
        **dict.fromkeys("num_reqs num_tokens decode_threshold".split(), 1)}, dict(
        BLOCK=256, CHUNK=128)
    yield staging._pad_kernel(), {
        **ptrs("host_counts qsl seq_lens counts_out", I32), "slots": I64, "num_reqs": 1,
        "num_tokens": 1}, dict(BLOCK=256)
    swa = {**ptrs("token_to_req swa_block_table block_table swa_indices_out swa_lens_out "
                  "dense_indices_out dense_lens_out prefill_swa_out prefill_swa_lens_out "
                  "replay_start spans counts", I32),
           **ptrs("slot_mapping positions", I64), "is_valid_out": B,
           **dict.fromkeys("swa_bt_stride bt_stride num_tokens num_decode_tokens "
                           "decode_rows".split(), 1)}
    # The last case: V4's vision variant, 64 image spans of up to 1024 tokens.
    for has_dense, prefill_rows, device_counts, spans in (
            (True, True, True, 0), (True, False, False, 0), (False, False, False, 0),
            (False, True, True, 0), (True, True, True, 64)):
        yield swa_decode._swa_decode_kernel(), swa, dict(
            WINDOW=128, SWA_BLOCK=64, HAS_DENSE=has_dense, SWA_PREFILL=prefill_rows,
            HAS_REPLAY=prefill_rows and not has_dense, DEVICE_COUNTS=device_counts,
            PREFILL_WIDTH=128 + (1024 if spans else 0), DENSE_WIDTH=8192, DENSE_ENTRIES=2,
            DENSE_RATIO=128, MIT=1024 if spans else 1, NUM_SPANS=spans, BLOCK_S=max(spans, 16),
            BLOCK_T=2, BLOCK_W=2048 if spans else 128, BLOCK_C=1024)
    for device_counts in (True, False):
        yield swa_dense_prefill._chunk_kernel(), {
            **ptrs("indices lens counts", I32), "positions": I64, **dict.fromkeys(
                "first_row num_rows num_tokens num_decode_tokens".split(), 1)}, dict(
            DEVICE_COUNTS=device_counts, WIDTH=8192, RATIO=128, BLOCK_T=2, BLOCK_C=1024)
    for device_counts in (True, False):
        yield swa_prefill._gather_lens_kernel(), {
            **ptrs("out seq_lens_out seq_lens qsl counts replay_start chunks num_chunks", I32),
            **dict.fromkeys("num_decodes num_prefills window gather_blocks plan_rows "
                            "packed_ratios budget_base max_model_len chunk_size".split(), 1)
        }, dict(WRITE_SEQ_LENS=device_counts, DEVICE_COUNTS=device_counts,
                HAS_REPLAY=device_counts, BLOCK=128)

    yield staging._replay_start_kernel(), {
        **ptrs("host_replay_start counts replay_start_out", I32), "num_reqs": 1}, dict(
        BLOCK=256)
    for device_counts in (True, False):
        for has_topk in (True, False):
            for spans in ((0, 64) if device_counts and has_topk else (0,)):
                yield swa_combined._combined_kernel(), {
                    **ptrs("out lens_out token_to_req seq_lens gather_lens chunks num_chunks "
                           "topk counts spans", I32), "positions": I64, **dict.fromkeys(
                        "topk_stride d_static td_static nt_static num_tokens max_chunks ratio "
                        "topk_width window width".split(), 1)}, dict(
                    DEVICE_COUNTS=device_counts, HAS_TOPK=has_topk,
                    MIT=1024 if spans else 1, NUM_SPANS=spans, BLOCK_S=max(spans, 16),
                    ROWS=4, BLOCK_C=128, BLOCK_CH=128)
            yield swa_flashinfer._flashinfer_kernel(), {
                **ptrs("out lens_out token_to_req swa_block_table replay_start topk cbt counts",
                       I32), **ptrs("slot_mapping positions", I64), **dict.fromkeys(
                    "swa_bt_stride topk_stride cbt_stride td_static nt_static num_tokens "
                    "topk_width ratio entries_per_page width".split(), 1)}, dict(
                WINDOW=128, SWA_BLOCK=32, HAS_REPLAY=device_counts, HAS_TOPK=has_topk,
                DEVICE_COUNTS=device_counts, ROWS=2, BLOCK_W=128, BLOCK_K=128)
    for device_counts in (True, False):
        yield swa_replay._replay_kernel(), {
            **ptrs("qsl seq_lens replay_start counts qsl_out query_lens_out kv_start_out "
                   "rows_out token_to_req_out counts_out", I32),
            **ptrs("slot_mapping positions positions_out slots_out", I64), **dict.fromkeys(
                "k_static d_static num_reqs num_tokens window".split(), 1)}, dict(
            DEVICE_COUNTS=device_counts, HAS_REPLAY=device_counts, BLOCK_T=16, BLOCK_R=256)
        yield swa_draft._draft_kernel(), {
            **ptrs("indices lens token_to_req qsl seq_lens swa_block_table counts", I32),
            "is_valid": B, "slot_mapping": I64, **dict.fromkeys(
                "swa_bt_stride nt_static num_tokens window".split(), 1)}, dict(
            WIDTH=192, SWA_BLOCK=32, DEVICE_COUNTS=device_counts, ROWS=2, BLOCK_W=256)

    kv = {**ptrs("qsl token_to_req replay_start", I32), **ptrs("positions own_slots", I64),
          **dict.fromkeys("window num_reqs num_tokens world rank interleave".split(), 1)}
    for j in range(3):
        kv.update({**ptrs(f"table{j} counts{j} ring_table{j}", I32),
                   **ptrs(f"slots{j} ring{j}", I64), **dict.fromkeys(
                       f"stride{j} ratio{j} entries{j} ring_stride{j} cap{j}".split(), 1)})
    for num_types, gate, ring, shard in ((1, True, False, True), (2, True, True, True),
                                         (3, False, True, False)):
        flags = {f"{name}{j}": value for j in range(3)
                 for name, value in (("GATE", gate), ("RING", ring), ("SHARD", shard))}
        yield compressed_kv._kernel(), kv, dict(NUM_TYPES=num_types, HAS_REPLAY=gate, **flags,
                                                BLOCK=256)
    for device_counts, fill, dcp in ((True, False, True), (False, True, False),
                                     (True, True, True)):
        yield compressed_topk._kernel(), {
            **ptrs("topk token_to_req table out lens_out counts entry_counts", I32),
            "own_slots": I64,
            **dict.fromkeys("topk_stride table_stride num_cols out_stride num_rows width "
                            "entries world rank interleave".split(), 1)}, dict(
            DEVICE_COUNTS=device_counts, FILL=fill, DCP=dcp, ROWS=4, COLS=512)
    yield short_topk._kernel(), {**ptrs("topk key_counts", I32), **dict.fromkeys(
        "topk_stride num_rows width".split(), 1)}, dict(ROWS=4, COLS=512)
    yield entry_boundary._kernel(), {"slots": I64, "flag_out": I32, "num_tokens": 1}, dict(
        BLOCK=1024)
    yield dcp_shares._swa_kernel(), {**ptrs("rows lens out lens_out", I32), "positions": I64,
                                     **dict.fromkeys("rows_stride out_stride num_rows width "
                                                     "world rank interleave".split(), 1)}, dict(
        ROWS=4, COLS=128)
    yield dcp_shares._dense_kernel(), {**ptrs("lens token_to_req table out lens_out", I32),
                                       **dict.fromkeys("table_stride num_cols out_stride "
                                                       "num_rows width entries world "
                                                       "rank".split(), 1)}, dict(
        ROWS=4, COLS=128)

    gather = {**ptrs("token_to_req qsl bt swa_bt counts swa_idx swa_len gather_lens "
                     "pre_seq_lens c_idx c_len i_lens i_bt bounds num_chunks cu "
                     "ks ke swa_cache c_cache i_cache", I32), "positions": I64,
              "out": I64, **dict.fromkeys(
                  "bt_stride swa_bt_stride i_bt_stride swa_size c_size i_size swa_rows "
                  "pre_rows i_rows i_width i_decode_tokens max_chunks window swa_bs "
                  "storage_bs out_stride".split(), 1)}
    for everything in (True, False):
        yield gather_checksums._gather_kernel(), gather, dict(
            HAS_S=everything, HAS_PRE=everything, HAS_C=everything,
            HAS_I=True, HAS_PLAN=everything, I_FLATTEN=everything,
            I_DEVICE_COUNTS=everything, C_WIDTH=8192, BLOCK_W=128, BLOCK_C=1024, TAIL=32,
            BLOCK_CHUNKS=64, I_COL=2 if everything else 3, WRITE_SC=everything)
    yield dense_prefill_checksums._chunk_sums_kernel(), {
        **ptrs("token_to_req bt counts indices lens cache", I32), "out": I64,
        **dict.fromkeys("out_stride bt_stride cache_size first_row entries".split(), 1)}, dict(
        WIDTH=8192, BLOCK_C=1024, COLUMN=1)
    compressed = {**ptrs("token_to_req counts table entry_counts kv_cache ring_cache", I32),
                  **ptrs("out slots ring_slots", I64), **dict.fromkeys(
                      "out_stride table_stride kv_size ring_size entries".split(), 1)}
    for ring in (True, False):
        yield compressed_checksums._checksum_kernel(), compressed, dict(RING=ring, TAIL=32)


def main() -> int:
    count = 0
    for kernel, args, constexprs in cases():
        try:
            compiled = compile_sm90(kernel, args, constexprs)
        except Exception as exc:
            print(f"{kernel.fn.__name__} {constexprs}: {type(exc).__name__}: {exc}")
            return 1
        # Before layouts are assigned, a barrier comes only from tl.debug_barrier (its
        # name in the IR changed across Triton releases).
        ttir = compiled.asm["ttir"]
        barriers = ttir.count("ttg.barrier") + ttir.count("gpu.barrier")
        if barriers < incremental_writers(kernel, constexprs):
            print(f"{kernel.fn.__name__} {constexprs}: {barriers} barriers for "
                  f"{incremental_writers(kernel, constexprs)} incremental row writers")
            return 1
        count += 1
    print(f"compiled {count} kernel variants for sm_90")
    return 0


if __name__ == "__main__":
    sys.exit(main())

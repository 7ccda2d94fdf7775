"""The indexer's Triton kernels compile for sm_90 on a machine without a GPU.

The CPU tests run the kernels under Triton's interpreter, which does not type-check them as
the compiler does (loop-carried types, mask dtypes, constexpr use). Compiling to a cubin
needs no device, so this catches those errors here; on a GPU the gpu tests compile for real.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
import torch

SCRIPT = textwrap.dedent("""
    import sys
    try:
        import triton
        from triton.backends.compiler import GPUTarget
        from triton.compiler import ASTSource
    except ImportError:
        sys.exit(77)
    from staticattn.kernels import indexer_kernel, indexer_prefill
    from staticattn.kernels import mqa_schedule

    def compile_sm90(kernel, types, constexprs):
        signature = dict(zip(kernel.arg_names, types.split()))
        signature.update({name: "constexpr" for name in constexprs})
        src = ASTSource(fn=kernel, signature=signature, constexprs=constexprs)
        triton.compile(src, target=GPUTarget("cuda", 90, 32))

    decode_args = ("*i32 *i32 *i32 i32 *i64 *i32 *i32 *i32 *i32 i32 *i64 "
                   "i32 i32 i32 i32 i32 i32 i32")
    for flatten in (True, False):
        for slots in (True, False):
            compile_sm90(indexer_kernel._decode_kernel(), decode_args,
                         {"DECODE": True, "FLATTEN": flatten, "SLOTS": slots, "BLOCK": 128,
                          "COLS": 64})
    # The slots-only mode, as compressed_slots launches it (placeholders are int64 views).
    compile_sm90(indexer_kernel._decode_kernel(),
                 "*i32 *i64 *i32 i32 *i64 *i32 *i64 *i64 *i32 i32 *i64 "
                 "i32 i32 i32 i32 i32 i32 i32",
                 {"DECODE": False, "FLATTEN": False, "SLOTS": True, "BLOCK": 128, "COLS": 64})
    for legacy in (True, False):
        compile_sm90(mqa_schedule._schedule_kernel(), "*i32 i32 i32 i32 *i32 i32 i32",
                     {"LEGACY": legacy, "SPLIT": 256, "SM_BLOCK": 256, "CHUNK": 1024,
                      "ROWS": 128, "SMS_STEP": 16})
    compile_sm90(indexer_prefill._chunk_kernel(), "*i32 *i32 *i32 *i32 *i32 i32 i32",
                 {"BLOCK": 256})
""")


@pytest.mark.skipif(torch.cuda.is_available(), reason="the gpu tests compile the kernels")
def test_indexer_kernels_compile_for_sm90():
    env = {**os.environ, "TRITON_INTERPRET": "0"}
    done = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True,
                          text=True, timeout=600)
    if done.returncode == 77:
        pytest.skip("this Triton has no ahead-of-time compile API")
    assert done.returncode == 0, done.stderr[-4000:]

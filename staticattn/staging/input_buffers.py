"""The input views every arena has, and the conventions of padded entries.

Device views (``input.*``) are what builders and captured steps read; host views
(``staging.*``, pinned on CUDA) are where the host writes a step's small arrays.
"""

from __future__ import annotations

import torch

from staticattn.arena.buffers import PAD_SLOT_ID, BufferDecl
from staticattn.arena.config import ArenaConfig
from staticattn.arena.groups import cache_groups
from staticattn.kernels.staging.stage_inputs import NUM_COUNTS

__all__ = ["input_buffers", "PAD_SLOT_ID"]



def input_buffers(config: ArenaConfig) -> list[BufferDecl]:
    """The input views every arena has: device inputs and their host staging.

    Device (``input.*``): ``query_start_loc`` int32 ``(max_num_seqs + 1,)``, ``seq_lens`` int32
    ``(max_num_seqs,)``, ``slot_mapping`` / ``positions`` int64 ``(max_num_batched_tokens,)``,
    ``token_to_req`` int32 ``(max_num_batched_tokens,)``, ``block_table`` int32
    ``(max_num_seqs, max_blocks_per_req)``, and with SWA ``swa_block_table`` int32
    ``(max_num_seqs, max_swa_blocks_per_req)``; per cache group with a table of its own
    (:func:`~staticattn.arena.cache_groups`, DeepSeek V4.1) ``block_tables.<group>`` int32
    ``(max_num_seqs, group.columns)``; ``step_counts`` int32 ``(4,)``: the real
    requests and tokens and the decode/prefill split, and ``query_lens`` int32
    ``(max_num_seqs,)``, each request's query length, derived on the device
    (:mod:`staticattn.kernels.staging.stage_inputs`).
    Host (``staging.*``): ``query_start_loc``, ``seq_lens``, ``slot_mapping`` and ``counts``
    int32 ``(4,)`` (the real requests and tokens of the step).
    With bounded replay (:attr:`ArenaConfig.bounded_replay`, ``docs/spec/deepseek-v41.md``
    §8.1): ``staging.replay_start`` int32 ``(max_num_seqs,)`` host and ``input.replay_start``
    int32 ``(max_num_seqs,)`` device, each prefilling request's first replayed position (0
    for decodes and padded requests).
    With image spans (:attr:`ArenaConfig.image_spans`, ``vllm-0.33-extras.md`` §3):
    ``staging.image_spans`` host and ``input.image_spans`` device, int32
    ``(max_image_spans, 3)``, rows ``(request, first, last)`` (:mod:`staticattn.staging.
    images`; unused rows request -1).
    """
    r, t = config.max_num_seqs, config.max_num_batched_tokens
    decls = [
        BufferDecl("input.query_start_loc", (r + 1,), torch.int32),
        BufferDecl("input.seq_lens", (r,), torch.int32),
        BufferDecl("input.slot_mapping", (t,), torch.int64, fill=PAD_SLOT_ID),
        BufferDecl("input.positions", (t,), torch.int64),
        BufferDecl("input.token_to_req", (t,), torch.int32),
        BufferDecl("input.block_table", (r, config.max_blocks_per_req), torch.int32),
        BufferDecl("input.step_counts", (NUM_COUNTS,), torch.int32),
        BufferDecl("input.query_lens", (r,), torch.int32),
        BufferDecl("staging.query_start_loc", (r + 1,), torch.int32, where="host"),
        BufferDecl("staging.seq_lens", (r,), torch.int32, where="host"),
        BufferDecl("staging.slot_mapping", (t,), torch.int64, where="host", fill=PAD_SLOT_ID),
        BufferDecl("staging.counts", (NUM_COUNTS,), torch.int32, where="host"),
    ]
    if config.has_swa:
        decls.append(
            BufferDecl("input.swa_block_table", (r, config.max_swa_blocks_per_req), torch.int32)
        )
    if config.bounded_replay:
        decls += [BufferDecl("input.replay_start", (r,), torch.int32),
                  BufferDecl("staging.replay_start", (r,), torch.int32, where="host")]
    if config.image_spans:
        shape = (config.max_image_spans, 3)
        decls += [BufferDecl("input.image_spans", shape, torch.int32, fill=-1),
                  BufferDecl("staging.image_spans", shape, torch.int32, where="host", fill=-1)]
    decls += [BufferDecl(f"input.block_tables.{g.name}", (r, g.columns), torch.int32)
              for g in cache_groups(config)]
    return decls

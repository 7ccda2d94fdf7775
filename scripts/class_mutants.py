"""Hand-written one-line mutants of the bug classes of issue #46 ("tests that a plausible
one-line bug fails"), run by ``scripts/mutate.py --classes``.

Each mutant replaces one exact piece of one line (found exactly once in its file) and names
the tests that must kill it: the tests written for its class. ``equivalent`` says why a
mutant computes what the original does (it is run, and left out of the score), or is
empty.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["CLASSES", "CLASS_MUTANTS", "ClassMutant"]


@dataclass(frozen=True)
class ClassMutant:
    """One mutant: ``original`` -> ``mutated`` in ``path``, killed by ``tests``."""

    cls: str
    path: str
    original: str
    mutated: str
    tests: tuple[str, ...]
    equivalent: str = ""


#: class -> (what it is, the tests that must kill its mutants).
CLASSES: dict[str, tuple[str, tuple[str, ...]]] = {
    "mqa-tiles": ("paged-MQA schedule, decode rows past one 128-row tile, next_n >= 3",
                  ("tests/kernels/test_mqa_schedule_tiles.py",)),
    "replay-decodes": ("replay_start on a step with no prefill request",
                       ("tests/validation/test_replay_start_decodes.py",)),
    "span-falls": ("span rows left in the handed-out block after falling span counts",
                   ("tests/staging/test_span_block_rows.py",)),
    "dcp-interleave": ("DCP per-rank SWA shares at an interleave above 1",
                       ("tests/consumers/test_dcp_shares_interleave.py",)),
    "topk-wide": ("short-context top-k fill wider than one column block",
                  ("tests/kernels/test_short_topk_wide.py",)),
    "extent-names": ("the checker's finding names the extent the step reads",
                     ("tests/checks/test_checker_extent_names.py",)),
}

_MQA = "staticattn/kernels/indexer/mqa_schedule.py"
_REPLAY = "staticattn/validation/replay_start.py"
_VIEWS = "staticattn/validation/in_place_views.py"
_SPANS = "staticattn/staging/span_block.py"
_SHARES = "staticattn/kernels/dcp/rank_shares.py"
_FILL = "staticattn/kernels/indexer/short_topk_fill.py"
_OPERAND = "staticattn/kernels/compressed/topk_operand.py"
_PROBE = "staticattn/checks/extent_probe.py"


def _m(cls: str, path: str, original: str, mutated: str, equivalent: str = "") -> ClassMutant:
    return ClassMutant(cls, path, original, mutated, CLASSES[cls][1], equivalent)


CLASS_MUTANTS: list[ClassMutant] = [
    # 1. The schedule's Triton pass 2 carries splits from tile to tile; units are splits x
    #    atoms. next_n 1 and 2 have one token an atom, so atoms = 1 hides a mix-up.
    _m("mqa-tiles", _MQA, "carry += tl.sum(splits, axis=0)",
       "carry += tl.sum(splits, axis=0) * atoms"),
    _m("mqa-tiles", _MQA, "incl = tl.cumsum(splits, axis=0) + carry",
       "incl = tl.cumsum(splits, axis=0) + carry * atoms"),
    _m("mqa-tiles", _MQA, "tl.store(out + s * 2, b[:, None] * atoms + off // segs",
       "tl.store(out + s * 2, (b[:, None] - c) * atoms + off // segs"),
    _m("mqa-tiles", _MQA, "tail = (sm <= num_sms) & (sm_first >= units)",
       "tail = sm_first >= units"),
    _m("mqa-tiles", _MQA, "width = (upto - before) // atoms",
       "width = (upto - before) // next_n"),
    # 2. An all-decode step: no request is over the threshold.
    _m("replay-decodes", _REPLAY,
       "int(over.argmax()) if over.any() else query_lens.shape[0]",
       "int(over.argmax()) if over.any() else 0"),
    _m("replay-decodes", _REPLAY,
       "int(over.argmax()) if over.any() else query_lens.shape[0]",
       "int(over.argmax()) if over.any() else query_lens.shape[0] - 1"),
    _m("replay-decodes", _REPLAY, "over = query_lens > threshold",
       "over = query_lens >= threshold"),
    _m("replay-decodes", _REPLAY, "if not rs.any():", "if not rs.all():"),
    _m("replay-decodes", _VIEWS, "None if replay is None else replay[:num_reqs])",
       "None if replay is None else replay[: num_reqs - 1])"),
    _m("replay-decodes", _VIEWS, "if replay is not None and replay.item(replay.argmax()):",
       "if replay is not None and replay.item(replay.argmin()):"),
    _m("replay-decodes", "staticattn/graphs/runner.py",
       "if ((eager is None or eager is _GRAPH) and replay_start is None",
       "if ((eager is None or eager is _GRAPH)"),
    # 3. run() stages the block's first rows; begin_step() clears the most since the last
    #    hand-out.
    _m("span-falls", _SPANS, "if n > self._staged:", "if n != self._staged:"),
    _m("span-falls", _SPANS, "if n > self._staged:", "if n > 0:"),
    _m("span-falls", _SPANS, "self.host[: self._staged] = NO_REQUEST",
       "self.host[: self._staged - 1] = NO_REQUEST"),
    _m("span-falls", _SPANS, "        if self._staged:\n", "        if self._staged > 1:\n"),
    _m("span-falls", _SPANS, "            self._staged = 0\n", "            pass\n",
       "the rows run() staged are cleared again at every later hand-out: before the engine "
       "writes the step, so only rows it has not written yet (a cost, not a result)"),
    # 4. Window positions dealt in groups of I tokens.
    _m("dcp-interleave", _SHARES, "x = ((local // interleave) * (interleave * world)",
       "x = ((local // interleave) * world"),
    _m("dcp-interleave", _SHARES, "+ local % interleave)", "+ local % world)"),
    _m("dcp-interleave", _SHARES, "before = dcp_local_count_tl(start, world, rank, interleave)",
       "before = dcp_local_count_tl(start, world, rank, 1)"),
    _m("dcp-interleave", _SHARES,
       "column = dcp_global_index(before[:, None] + j, world, rank, interleave)",
       "column = dcp_global_index(before[:, None] + j, world, rank, 1)"),
    _m("dcp-interleave", _SHARES,
       "held = torch.where(n > 0, dcp_local_count(p + 1, world, rank, interleave) - before",
       "held = torch.where(n > 0, dcp_local_count(p, world, rank, interleave) - before"),
    _m("dcp-interleave", "staticattn/consumers/dcp/shares.py",
       "interleave=self.swa_interleave)", "interleave=1)"),
    # 5. Column blocks of 1024: V3.2's top-k of 2048 takes two.
    _m("topk-wide", _FILL, "cols = c0 + tl.arange(0, COLS)", "cols = tl.arange(0, COLS)"),
    _m("topk-wide", _FILL, "cells = fits[:, None] & (cols < width)[None, :]",
       "cells = fits[:, None] & (cols <= width)[None, :]"),
    _m("topk-wide", _FILL, "for c0 in range(0, width, COLS):",
       "for c0 in range(0, COLS, COLS):"),
    _m("topk-wide", "staticattn/kernels/runtime/compiled_launch.py", "MAX_COL_TILE = 1024",
       "MAX_COL_TILE = 4096",
       "a wider column block covers the same columns in one pass of the masked loop"),
    _m("topk-wide", _OPERAND, "lens += tl.sum(ok.to(tl.int32), axis=1)",
       "lens = tl.sum(ok.to(tl.int32), axis=1)"),
    _m("topk-wide", _OPERAND, "cells = in_rows[:, None] & (cols < width)[None, :]",
       "cells = in_rows[:, None] & (cols <= width)[None, :]"),
    _m("topk-wide", _OPERAND, "cols = c0 + tl.arange(0, COLS)", "cols = tl.arange(0, COLS)"),
    # 6. The finding names the one field whose capture value gives the replay's outputs.
    _m("extent-names", _PROBE, '"num_reqs", "num_actual_tokens")', '"num_reqs")'),
    _m("extent-names", _PROBE, "return name, captured, own", "return name, own, captured"),
    _m("extent-names", _PROBE, "if captured == own:", "if captured != own:"),
    _m("extent-names", _PROBE,
       "if outputs_differ(replayed, snapshot_outputs(out, n_tok)) is None:",
       "if outputs_differ(replayed, snapshot_outputs(out, n_tok)) is not None:"),
    _m("extent-names", _PROBE, "for name in EXTENT_FIELDS:", "for name in EXTENT_FIELDS[:-1]:"),
    _m("extent-names", _PROBE, "dataclasses.replace(batch, **{name: captured})",
       "dataclasses.replace(batch, **{name: own})"),
]

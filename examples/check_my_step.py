"""Check a step of your own for CUDA-graph safety: the planted bug, the report, the fix.

The step and its buggy twin are the plugin example's (``examples/plugin_project/my_step.py``,
whose ``test_my_step.py`` asserts the same through the pytest plugin). The buggy twin
branches on ``.item()``: the checker captures it, finds the host sync, and says FAIL with
the op named; the fixed step passes (notes, if any, are things allowed but worth knowing).

Without CUDA there is no graph to capture: the script runs the checks that need none
(:func:`staticattn.checks.check_eagerly`: random steps run eagerly, each step's output fed by
the graph builds against the same step fed by the reference builds, and the builds'
metadata against the plain-Python reference), then says what only a GPU can check. Both
steps pass there: the planted bug is a capture bug.

    python -m examples.check_my_step [--batches 20]      (from the repository root)
"""

from __future__ import annotations

import argparse
import sys

import torch

from examples.plugin_project.my_step import MyStep, MyStepWithSync, config
from staticattn import GraphManager, GraphOptions, check_graph_safety, make_arena
from staticattn.bench.random_batches import NUM_KV_BLOCKS
from staticattn.builders import IndexerMetadataBuilder, SparseSWAMetadataBuilder
from staticattn.checks import check_eagerly
from staticattn.checks.reference_check import CAPTURE_ONLY


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, default=20,
                        help="random batches per size (without CUDA: random steps)")
    args = parser.parse_args()
    cuda = torch.cuda.is_available()
    cfg = config(device="cuda" if cuda else "cpu")
    builders = [IndexerMetadataBuilder(), SparseSWAMetadataBuilder()]
    arena, inputs = make_arena(cfg, builders)
    steps = {"with the planted bug": MyStepWithSync(cfg), "fixed": MyStep(cfg)}
    if not cuda:
        print("no CUDA: running the checks that need no graph capture")
        passed = {}
        for name, step in steps.items():
            options = GraphOptions(progress=False, num_kv_blocks=NUM_KV_BLOCKS)
            with GraphManager(arena, inputs, builders, step, options) as gm:
                found = check_eagerly(gm, num_steps=args.batches, seed=0)
            print(f"--- the step {name}:")
            print("\n".join(found.lines()))
            passed[name] = found.ok
        print("needs a GPU (not checked here): " + ", ".join(CAPTURE_ONLY) + "; the planted "
              ".item() sync is found only there")
        failed = [name for name, ok in passed.items() if not ok]
        print("PASS without CUDA: both steps equal through the graph and the reference builds, "
              "metadata equal to the reference" if not failed
              else f"FAIL without CUDA: the step {', '.join(failed)}")
        return 1 if failed else 0
    verdicts = {}
    for name, step in steps.items():
        report = check_graph_safety(arena, inputs, builders, step, sizes=[2, 16],
                                    num_batches=args.batches)
        print(f"--- the step {name}:\n{report}\n")
        verdicts[name] = report.ok
    expected = {"with the planted bug": False, "fixed": True}
    print("the checker found the bug and passes the fix:", verdicts == expected)
    return 0 if verdicts == expected else 1


if __name__ == "__main__":
    sys.exit(main())

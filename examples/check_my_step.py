"""Check a step of your own for CUDA-graph safety: the planted bug, the report, the fix.

The step and its buggy twin are the plugin example's (``examples/plugin_project/my_step.py``,
whose ``test_my_step.py`` asserts the same through the pytest plugin). The buggy twin
branches on ``.item()``: the checker captures it, finds the host sync, and says FAIL with
the op named; the fixed step passes (notes, if any, are things allowed but worth knowing).

Without CUDA there is no graph to capture: the script says so and runs both steps eagerly
once instead, which shows they compute the same thing (the bug is only a capture bug).

    python -m examples.check_my_step [--batches 20]      (from the repository root)
"""

from __future__ import annotations

import argparse
import sys

import numpy as np
import torch

from examples.plugin_project.my_step import MyStep, MyStepWithSync, config
from staticattn import EagerBuild, GraphManager, GraphOptions, check_graph_safety, make_arena
from staticattn.builders import IndexerMetadataBuilder, SparseSWAMetadataBuilder


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, default=20, help="random replays per size")
    args = parser.parse_args()
    cuda = torch.cuda.is_available()
    cfg = config(device="cuda" if cuda else "cpu")
    builders = [IndexerMetadataBuilder(), SparseSWAMetadataBuilder()]
    arena, inputs = make_arena(cfg, builders)
    steps = {"with the planted bug": MyStepWithSync(cfg), "fixed": MyStep(cfg)}
    if not cuda:
        print("no CUDA: the checker captures CUDA graphs and needs a GPU; running both steps "
              "eagerly once instead")
        q, seq = np.array([2, 2, 7]), np.array([40, 9, 7])
        outs = []
        for name, step in steps.items():
            with GraphManager(arena, inputs, builders, step, GraphOptions(progress=False)) as gm:
                res = gm.run(q, seq, np.arange(int(q.sum())), eager=EagerBuild.REFERENCE)
                outs.append(res.outputs.clone())
            print(f"{name}: {outs[-1].tolist()}")
        print("same outputs eagerly:", torch.equal(*outs))
        return 0
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

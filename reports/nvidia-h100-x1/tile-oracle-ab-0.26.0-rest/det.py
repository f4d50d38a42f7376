"""Is each build's output for one case the same call after call? (nondeterminism check on the GPU)"""

import sys
from pathlib import Path

import torch

from ci.kernel.bench import timing_experts
from ci.kernel.graphs import CaseRunner
from ci.kernel.suites import suite_cases
from ci.moe.routing import rank_view
from ci.trees.manifest import load_trees
from ci.trees.variants import load_variants, put_base_first

trees = load_trees(Path(sys.argv[1]))
put_base_first(trees)
variants = load_variants(trees)
for cid in sys.argv[2].split(","):
    case = suite_cases("high_load", cid)[0]
    experts = timing_experts(case, rank_view(case.experts, case.ep, 0).local_ids.numel())
    runner = CaseRunner(case, experts)
    r = runner.inputs[0]
    for v in variants:
        outs = [runner.valid_output(runner.call(v.marlin_moe, r), r).clone() for _ in range(8)]
        same = [bool(torch.equal(outs[0], o)) for o in outs[1:]]
        diffs = [float((outs[0].double() - o.double()).norm() / outs[0].double().norm()) for o in outs[1:]]
        print(f"{cid} {v.name}: identical to call 1: {same}; max rel L2 {max(diffs):.2e}", flush=True)
    del experts, runner
    torch.cuda.empty_cache()

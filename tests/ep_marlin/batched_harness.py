"""The batched path's harness for the CPU tier: vLLM's real ``batched_fused_marlin_moe`` with its CUDA work
(``batched_moe_align_block_size``, ``_fused_marlin_moe``) replaced by spies, the grid of calls, and the
checks every change must keep (``test_batched_path.py`` and ``test_mutants.py`` use them)."""

from __future__ import annotations

import itertools

import torch

from ci.kernel import moe_case as mc
from ci.kernel import weights
from ci.kernel.formats import FORMAT_COMBOS, FORMATS_BY_NAME
from ci.moe import spec
from ci.moe.patching import swapped
from tests.ep_marlin import cpu_harness as h

CAPACITIES = (1, 2, 7, 8, 9, 14, 15, 16, 17, 28, 29, 32, 43, 44, 48, 57, 58, 64, 65, 128, 256, 1024)
LOCAL_EXPERTS = (1, 4, 8)
LOADS = ("full", "sparse", "empty")  # tokens per expert: all at capacity, a few, none
# apply(): this rank's tokens and top-k, and the dispatchers (EP ranks) sending to it
APPLY_CAPACITIES = (1, 8, 9, 17, 44, 64, 65, 256, 1024)
APPLY_TOKENS = (1, 4, 64)
APPLY_TOPK = (1, 8)
DISPATCHERS = (1, 8)


class BatchedSpies:
    def __init__(self, module) -> None:
        self.module, self.align, self.kernel = module, [], []

    def _align(self, *, max_tokens_per_batch, block_size, expert_num_tokens):
        self.align.append(
            {
                "max_tokens_per_batch": max_tokens_per_batch,
                "block_size": block_size,
                "expert_num_tokens": expert_num_tokens,
            }
        )
        n = expert_num_tokens.numel() * max_tokens_per_batch
        return torch.arange(n, dtype=torch.int32), torch.zeros(1, dtype=torch.int32), torch.tensor([n])

    def _kernel(self, **kwargs):
        self.kernel.append(kwargs)
        return kwargs["hidden_states"].clone()

    def __enter__(self):
        self._swap = swapped(self.module, batched_moe_align_block_size=self._align, _fused_marlin_moe=self._kernel)
        self._swap.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self._swap.__exit__(*exc)


def experts_of(args: dict) -> weights.Experts:
    """The weight arguments of ``cpu_harness.format_arguments`` as the ``Experts`` a batched caller holds."""
    names = dict(
        w1="w1",
        w2="w2",
        s1="w1_scale",
        s2="w2_scale",
        zeros1="w1_zeros",
        zeros2="w2_zeros",
        g_idx1="g_idx1",
        g_idx2="g_idx2",
        sort1="sort_indices1",
        sort2="sort_indices2",
        global_scale1="global_scale1",
        global_scale2="global_scale2",
        bias1="bias1",
        bias2="bias2",
        input_global_scale1="input_global_scale1",
        input_global_scale2="input_global_scale2",
    )
    fields = {k: args.get(v) for k, v in names.items()}
    return weights.Experts(scheme=None, quant_type_id=args["quant_type_id"], **fields)


def observe(module, call: dict) -> dict:
    """One call, ``call["via"]`` "direct" or "apply"; what the spies saw."""
    e, cap = call["experts"], call["capacity"]
    fmt, dtype = FORMATS_BY_NAME[call["format"]], h.ACTIVATIONS[call["activation"]]
    gen = torch.Generator().manual_seed(e * 1009 + cap)
    hidden = torch.randn(e, cap, h.HIDDEN, generator=gen).to(dtype)
    per_expert = {"full": cap, "sparse": min(cap, 2), "empty": 0}[call["load"]]
    counts = torch.full((e,), per_expert, dtype=torch.int32)
    counts_before = counts.clone()
    args = h.format_arguments(fmt, e, dtype, gen)
    with BatchedSpies(module) as spies:
        if call["via"] == "direct":
            out = module.batched_fused_marlin_moe(
                hidden_states=hidden,
                expert_num_tokens=counts,
                **args,
                **mc.format_kwargs(fmt, module.batched_fused_marlin_moe),
            )
        else:
            g = e * call["dispatchers"]
            topk_ids = torch.randint(0, g, (call["tokens"], call["topk"]), generator=gen, dtype=torch.int32)
            w = experts_of(args)
            caller = mc.batched_experts(module, w, num_dispatchers=call["dispatchers"], max_num_tokens=cap, fmt=fmt)
            batched = mc.Batched(hidden=hidden, counts=counts, rows=None, slots=None, topk_ids=topk_ids)
            out = mc.call_batched(module, caller, w.w1, w.w2, batched, global_num_experts=g, fmt=fmt)
    assert len(spies.align) == 1 and len(spies.kernel) == 1, "one align and one kernel call"
    align, kernel = spies.align[0], spies.kernel[0]
    return {
        "align_block_size": align["block_size"],
        "kernel_block_size": kernel["block_size_m"],
        "aligner_inputs_ok": align["max_tokens_per_batch"] == cap
        and align["expert_num_tokens"] is counts
        and torch.equal(counts, counts_before),
        "kernel_args": {k: h.describe(v) for k, v in kernel.items()},
        "output_ok": tuple(out.shape) == (e, cap, h.HIDDEN) and torch.equal(out, hidden),
    }


def where(call: dict) -> str:
    return " ".join(f"{k}={v}" for k, v in call.items())


def _rotated(rows: list[tuple]) -> list[tuple]:
    """Each row tried with h.FORMATS_PER_M (format, dtype) pairs, taken in turn from ci.kernel.formats."""
    n = len(FORMAT_COMBOS)
    return [
        (*row, *FORMAT_COMBOS[(h.FORMATS_PER_M * i + j) % n])
        for i, row in enumerate(rows)
        for j in range(h.FORMATS_PER_M)
    ]


DIRECT = [
    dict(via="direct", experts=e, capacity=c, load=load, format=f.name, activation=act)
    for e, c, load, f, act in _rotated(list(itertools.product(LOCAL_EXPERTS, CAPACITIES, LOADS)))
]
APPLY = [
    dict(
        via="apply",
        experts=e,
        capacity=c,
        load="sparse",
        format=f.name,
        activation=act,
        tokens=t,
        topk=k,
        dispatchers=d,
    )
    for e, c, t, k, d, f, act in _rotated(
        list(itertools.product(LOCAL_EXPERTS, APPLY_CAPACITIES, APPLY_TOKENS, APPLY_TOPK, DISPATCHERS))
    )
]
CALLS = DIRECT + APPLY


def calls_for(combos) -> list[dict]:
    """The calls whose (format, dtype) the release serves (``cpu_harness.combos_for``)."""
    served = {(f.name, act) for f, act in combos}
    calls = [c for c in CALLS if (c["format"], c["activation"]) in served]
    # a test over no call checks nothing: it must fail, never pass (issue 40: 0.34.0's batched tests passed so)
    assert calls, (
        f"no batched case to run: the release serves none of the batched grid's (format, dtype) pairs "
        f"(it serves {sorted(served) or 'none'}); nothing would be checked"
    )
    return calls


def itemsize(call: dict) -> int | None:
    return FORMATS_BY_NAME[call["format"]].input_itemsize


def invariant_violations(obs: dict, call: dict) -> list[str]:
    errors, bm = [], obs["kernel_block_size"]
    if bm not in spec.BLOCK_SIZES_M or obs["align_block_size"] != bm:
        errors.append(
            f"{where(call)}: block size {obs['align_block_size']}/{bm} (aligner/kernel), not one tile "
            f"of {spec.BLOCK_SIZES_M}"
        )
    if itemsize(call) == 1 and bm < spec.MIN_BLOCK_SIZE_M_1_BYTE_INPUT:
        errors.append(f"{where(call)}: block size {bm} for a 1-byte input (at least 16)")
    if not obs["aligner_inputs_ok"] or not obs["output_ok"]:
        errors.append(
            f"{where(call)}: the aligner did not get the capacity and the caller's token counts, "
            "or the output is not the kernel's, reshaped"
        )
    return errors


def contract_rule(contract, call: dict, env: dict) -> int:
    apply = call["via"] == "apply"
    return contract.batched_block_size_m(
        capacity=call["capacity"],
        assignments=call["tokens"] * call["topk"] if apply else None,
        num_dispatchers=call.get("dispatchers", 1),
        global_experts=call["experts"] * call.get("dispatchers", 1),
        local_experts=call["experts"],
        input_itemsize=itemsize(call),
        env=env,
    )

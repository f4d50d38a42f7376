"""CPU tier: vLLM's real fused_marlin_moe from each tree, only its CUDA work replaced by spies.

Checks, over a grid of M, local experts, EP sizes, top-k and input dtypes:

* the base picks exactly the release's block size (``ci.moe.spec``: the oracle, written from the rule's words);
* the candidate keeps the universal invariants, in every setting its contract names: a block size the
  kernel has, the same one for aligner and kernel, at least 16 for 1-byte inputs, and
  ``moe_align_block_size`` gets the global expert count and the caller's ``expert_map``;
* the candidate picks exactly what its contract's rule says (``ci/changes/<name>/contract.py``), when the
  change has a contract with a rule for this path; without one, the test says that no rule was checked;
* every path the change does not declare (non-EP always, unless declared: ``global_num_experts == -1`` and
  ``global_num_experts == E`` with no expert map, as vLLM's modular kernel calls the experts) hands the kernels
  identical arguments in base and candidate (the promise of #48144: non-EP behaviour unchanged).
"""

from __future__ import annotations

import inspect
import types

import pytest

from ci.kernel.formats import FORMATS_BY_NAME
from ci.moe import spec
from ci.trees import contracts
from ci.trees.build import CHANGES_DIR
from tests.ep_marlin import cpu_harness as h
from tests.shared import COUNT_PROPERTY, NOT_IN_RELEASE_PROPERTY, contract_of

GRID = [
    pytest.param(e, ep, topk, id=f"E{e}-ep{'none' if ep is None else ep}-topk{topk}")
    for e in h.LOCAL_EXPERTS
    for ep in h.EP_SIZES
    for topk in h.TOP_KS
    if h.has_enough_experts(e, ep, topk)
]
NON_EP_GRID = [p for p in GRID if h.is_non_ep(p.values[1])]


def _observations(module, e, ep, topk, combos, expert_map_fn):
    for case in h.cases_for(e, ep, topk, combos):
        yield case, h.observe(module, case, h.make_inputs(case, expert_map_fn))


@pytest.mark.parametrize(("e", "ep", "topk"), GRID)
def test_base_follows_the_release_rule(e, ep, topk, trees, variants, combos, expert_map_fn, record_property):
    """The base tree picks the release's block size (the oracle in ci.moe.spec: 0.25.1's rule, or #48144's
    from 0.26.0 on; either, consistently, for a checkout's code) and feeds the aligner right."""
    rules = h.base_rules(trees.manifest)
    errors: dict[str, list[str]] = {name: [] for name in rules}
    n = 0
    for case, obs in _observations(variants[0].marlin_moe, e, ep, topk, combos, expert_map_fn):
        for name, patched in rules.items():
            errors[name] += h.block_size_mismatches(obs, case, patched=patched) + h.align_mismatches(obs, case)
        n += 1
    record_property(COUNT_PROPERTY, {"base": n})
    name = min(errors, key=lambda k: len(errors[k]))
    assert not errors[name], (
        f"{len(errors[name])} of {n} cases differ from the spec ({name} rule, vLLM "
        f"{trees.manifest.vllm_version}):\n" + "\n".join(errors[name][:20])
    )


@pytest.mark.parametrize(("e", "ep", "topk"), GRID)
def test_candidate_keeps_the_invariants_and_its_contract(
    e, ep, topk, setting, setting_env, contract, variants, combos, expert_map_fn, record_property
):
    """Universal invariants always; the contract's exact rule where it has one (under each of its settings)."""
    rule = contract.fused_block_size_m if contract else None
    errors, n = [], 0
    for case, obs in _observations(variants[1].marlin_moe, e, ep, topk, combos, expert_map_fn):
        errors += h.invariant_violations(obs, case)
        if rule is not None:
            errors += h.rule_mismatches(obs, case, h.rule_value(contract, case, setting_env), f"{contract.name}")
        n += 1
    record_property(
        COUNT_PROPERTY, {"candidate" if setting == contracts.DEFAULT_SETTING else f"candidate {setting}": n}
    )
    where = f"setting {setting} {setting_env}" if setting_env else "default setting"
    assert not errors, f"{len(errors)} of {n} cases break the invariants or the contract ({where}):\n" + "\n".join(
        errors[:20]
    )


def test_the_change_states_its_rule(contract, trees):
    """The contract the manifest recorded is the one checked; without one, the report says no rule was."""
    if contract is None:
        pytest.skip(contracts.NO_CONTRACT)
    assert contract.rules, f"{contract.path} declares no rule: only the invariants are checked"
    assert trees.manifest.contract["rules"] == contract.rules


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """The identical-arguments check runs on the grid points of the paths the change does not declare."""
    if metafunc.definition.name != "test_undeclared_paths_keep_the_base_arguments":
        return
    contract = contract_of(metafunc.config)
    points = [p for p in GRID if not contracts.may_change(contract, "non_ep" if h.is_non_ep(p.values[1]) else "ep")]
    everything = pytest.param(
        None,
        None,
        None,
        id="none",
        marks=pytest.mark.skip(reason="the change declares both fused paths (non-EP and EP) changed"),
    )
    metafunc.parametrize(("e", "ep", "topk"), points or [everything])


def test_undeclared_paths_keep_the_base_arguments(e, ep, topk, default_setting, variants, combos, expert_map_fn):
    """A path the change does not declare (non-EP always, unless declared): every kernel argument is the base's."""
    base, cand = (v.marlin_moe for v in variants)
    errors = []
    for case in h.cases_for(e, ep, topk, combos):
        inputs = h.make_inputs(case, expert_map_fn)
        errors += h.kernel_arg_differences(h.observe(base, case, inputs), h.observe(cand, case, inputs), case)
    assert not errors, "a path the change does not declare changed:\n" + "\n".join(errors[:20])


def test_grid_is_large():
    """The grid covers hundreds of configurations, odd M values and every EP size of the issue."""
    assert len(GRID) >= 150 and len(NON_EP_GRID) >= 30
    assert {1, 3, 8191, 8192} <= set(h.M_VALUES)
    assert {None, 1, 2, 4, 8, 16, 32} == set(h.EP_SIZES)
    assert spec.NON_EP == -1


def test_the_gpu_suite_runs_the_rule_where_it_leaves_48144_with_and_without_ep():
    """gpu_gate counts a changed line the GPU suite never ran as INCOMPLETE: its high-load cases must reach the
    rule's band (non-EP, both calls, and one EP rank), where #48144 picks another tile."""
    from tests.ep_marlin.test_gpu_equivalence import HIGH_LOAD_CASES, NON_EP_CALLS, SHAPES

    rule = contracts.load_contract(CHANGES_DIR / "tile-oracle" / contracts.CONTRACT_FILE).fused_block_size_m
    reached = set()
    for shape_name, ep, _, tokens in HIGH_LOAD_CASES:
        shape = SHAPES[shape_name]
        m, local = max(tokens) * len(tokens), shape.experts // ep
        calls = [g(shape) for g in NON_EP_CALLS.values()] if ep == 1 else [shape.experts]
        for glob in calls:
            kw = {"m": m, "topk": shape.topk, "local_experts": local, "global_experts": glob, "input_itemsize": 2}
            pr48144 = spec.expected_block_size_m(**kw, patched=True)
            if rule(**kw, env={}) != pr48144:
                reached.add((ep == 1, glob))
    assert reached == {(True, spec.NON_EP), (True, 8), (False, 8)}


def test_every_format_is_tried_at_every_grid_point(combos):
    """Each (format, dtype) pair the release serves is tried at every (E, EP, top-k) point, at several M."""
    for p in GRID:
        seen = [(c.fmt.name, c.activation) for c in h.cases_for(*p.values, combos)]
        assert {(f.name, act) for f, act in combos} == set(seen), p.id
        assert min(seen.count(k) for k in set(seen)) >= len(h.M_VALUES) * h.FORMATS_PER_M // len(combos)


def test_every_format_is_served_or_named_not_in_this_release(variants, combos, record_property):
    """Each format of ci.kernel.formats is either tried (the release's fused_marlin_moe takes what it needs)
    or named, with the arguments the release lacks for it, in the run's summary: never dropped unseen, and
    a release that serves none fails (nothing would be checked)."""
    lacking = h.not_in_release(variants[0].marlin_moe)
    served = {f.name for f, _ in combos}
    assert served, f"the release serves no format of ci.kernel.formats: {lacking}"
    assert served.isdisjoint(lacking) and served | set(lacking) == set(FORMATS_BY_NAME)
    record_property(NOT_IN_RELEASE_PROPERTY, lacking)


BATCH_INVARIANT = "VLLM_BATCH_INVARIANT"  # vLLM main: batch-invariant kernels, Marlin's tile pinned to 64
BATCH_INVARIANT_TILE = 64


def batch_invariant_violations(base, cand, cases, expert_map_fn) -> tuple[bool, list[str]]:
    """Under VLLM_BATCH_INVARIANT=1 (set by the caller): whether the base pins the tile to 64 in every case
    (the release has the mode), and where the candidate does not."""
    pinned, errors = True, []
    for case in cases:
        inputs = h.make_inputs(case, expert_map_fn)
        pinned &= h.observe(base, case, inputs).kernel_block_size == BATCH_INVARIANT_TILE
        got = h.observe(cand, case, inputs).kernel_block_size
        if got != BATCH_INVARIANT_TILE:
            errors.append(
                f"{case}: block_size_m {got} under {BATCH_INVARIANT}=1, the release pins {BATCH_INVARIANT_TILE}"
            )
    return pinned, errors


def test_batch_invariant_mode_keeps_the_releases_tile(variants, combos, expert_map_fn, monkeypatch):
    """A universal invariant where the release has it: vLLM main pins the tile to 64 under
    VLLM_BATCH_INVARIANT=1 (the same tile whatever the batch); if the base does, the candidate must too."""
    monkeypatch.setenv(BATCH_INVARIANT, "1")
    cases = [c for e, ep, topk in ((8, None, 2), (8, 4, 8), (32, 8, 6)) for c in h.cases_for(e, ep, topk, combos)]
    base, cand = (v.marlin_moe for v in variants)
    pinned, errors = batch_invariant_violations(base, cand, cases, expert_map_fn)
    if not pinned:
        pytest.skip(f"this release's fused_marlin_moe does not pin the tile under {BATCH_INVARIANT}=1: nothing to keep")
    assert not errors, f"{len(errors)} of {len(cases)} cases:\n" + "\n".join(errors[:20])


def _with_the_pin(module) -> types.ModuleType:
    """``module``'s source run as a new module, with vLLM main's pin added to fused_marlin_moe: 64 under
    VLLM_BATCH_INVARIANT=1, just before the aligner is called."""
    anchor = "    sorted_token_ids, expert_ids, num_tokens_post_padded = moe_align_block_size(\n"
    source = inspect.getsource(module)
    assert source.count(anchor) == 1, "fused_marlin_moe's call of moe_align_block_size moved: update the anchor"
    pin = (
        f'    if __import__("os").environ.get("{BATCH_INVARIANT}") == "1":\n'
        f"        block_size_m = {BATCH_INVARIANT_TILE}\n"
    )
    pinned = types.ModuleType(f"{module.__name__}_pinned")
    pinned.__package__, pinned.__file__ = module.__package__, module.__file__
    exec(compile(source.replace(anchor, pin + anchor), module.__file__, "exec"), pinned.__dict__)
    return pinned


def test_the_batch_invariant_check_sees_a_candidate_that_drops_the_pin(variants, combos, expert_map_fn, monkeypatch):
    """The check above on a release that pins the tile (the base with vLLM main's pin added): a candidate
    without the pin is caught, one with it passes."""
    base = variants[0].marlin_moe
    pinned = _with_the_pin(base)
    monkeypatch.setenv(BATCH_INVARIANT, "1")
    cases = h.cases_for(8, 4, 8, combos)
    held, errors = batch_invariant_violations(pinned, base, cases, expert_map_fn)
    assert (
        held
        and len(errors)
        == sum(
            1
            for c in cases
            if h.observe(base, c, h.make_inputs(c, expert_map_fn)).kernel_block_size != BATCH_INVARIANT_TILE
        )
        > 0
    )
    assert batch_invariant_violations(pinned, pinned, cases, expert_map_fn) == (True, [])

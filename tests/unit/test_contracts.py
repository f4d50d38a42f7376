"""ci.contracts: loading a change's contract, what it may change, and its record in the manifest."""

from __future__ import annotations

import pytest

from ci import contracts
from ci.build import CHANGES_DIR
from ci.errors import UsageError

GOOD = """
NAME = "x"
UPSTREAM = "PR 1"
SUMMARY = "s"
CHANGES_NON_EP = False
CHANGES_EP = True
CHANGES_BATCHED = False
SETTINGS = {"default": {}, "on": {"V": "1"}}
def fused_block_size_m(**kw):
    return 8
"""


def _write(tmp_path, text):
    path = tmp_path / "contract.py"
    path.write_text(text)
    return path


def test_a_good_contract_loads_with_its_rules_paths_and_settings(tmp_path):
    c = contracts.load_contract(_write(tmp_path, GOOD))
    assert (c.name, c.upstream, c.summary) == ("x", "PR 1", "s")
    assert c.rules == ["fused_block_size_m"] and c.batched_block_size_m is None
    assert c.settings == {"default": {}, "on": {"V": "1"}}
    assert [contracts.may_change(c, p) for p in contracts.PATHS] == [False, True, False]
    assert c.describe() == "contract x (PR 1): rules fused_block_size_m; may change EP fused; settings default, on"
    record = c.to_json()
    assert record["rules"] == ["fused_block_size_m"] and len(record["sha256"]) == 64 and record["name"] == "x"


def test_without_a_contract_only_the_non_ep_path_is_held():
    assert [contracts.may_change(None, p) for p in contracts.PATHS] == [False, True, True]
    with pytest.raises(ValueError, match="unknown path 'fused'"):
        contracts.may_change(None, "fused")


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda s: s.replace('NAME = "x"\n', ""), "does not define NAME"),
        (lambda s: s.replace("CHANGES_EP = True", "CHANGES_EP = 1"), "CHANGES_EP must be True or False"),
        (lambda s: s.replace('"default": {}, ', ""), "with a 'default' one"),
        (lambda s: s.replace('"default": {}', '"default": {"V": "0"}'), "must be empty"),
        (lambda s: s.replace('{"V": "1"}', '{"V": 1}'), "SETTINGS must map names"),
        (lambda s: s + "batched_block_size_m = 3\n", "batched_block_size_m must be a function"),
        (lambda s: s + "raise RuntimeError('boom')\n", "failed to load: RuntimeError: boom"),
    ],
)
def test_a_bad_contract_is_one_error_naming_the_file(tmp_path, edit, message):
    path = _write(tmp_path, edit(GOOD))
    with pytest.raises(UsageError, match=message) as err:
        contracts.load_contract(path)
    assert str(path) in str(err.value)


def test_settings_default_to_the_default_one(tmp_path):
    c = contracts.load_contract(_write(tmp_path, GOOD.replace('SETTINGS = {"default": {}, "on": {"V": "1"}}\n', "")))
    assert c.settings == {"default": {}}


def test_a_missing_contract_file_says_how_to_test_without_one(tmp_path):
    with pytest.raises(UsageError, match="'none' to test without one"):
        contracts.load_contract(tmp_path / "nope.py")


def test_beside_finds_the_contract_next_to_a_patch(tmp_path):
    patch = tmp_path / "change.patch"
    patch.write_text("")
    assert contracts.beside(patch) is None
    _write(tmp_path, GOOD)
    assert contracts.beside(patch) == tmp_path / "contract.py"


def test_the_manifest_record_is_checked_against_the_file(tmp_path):
    path = _write(tmp_path, GOOD)
    record = contracts.load_contract(path).to_json()
    assert contracts.from_manifest(None) is None
    assert contracts.from_manifest(record).name == "x"
    path.write_text(GOOD.replace('SUMMARY = "s"', 'SUMMARY = "t"'))
    with pytest.raises(UsageError, match=r"the contract changed since m\.json was built"):
        contracts.from_manifest(record, "m.json")


def test_the_shipped_changes_have_loadable_contracts():
    """Every folder of ci/changes holds a change.patch and a contract that loads, with at least one rule."""
    folders = sorted(p.parent for p in CHANGES_DIR.glob("*/change.patch"))
    assert [f.name for f in folders] == ["batched-tile-from-load", "block-size-override", "marlin-ep-m-estimate"]
    loaded = {f.name: contracts.load_contract(f / "contract.py") for f in folders}
    assert all(c.rules for c in loaded.values())
    assert loaded["block-size-override"].settings["override-8"] == {"VLLM_MARLIN_MOE_BLOCK_SIZE_M": "8"}
    assert not any(contracts.may_change(loaded["block-size-override"], p) for p in contracts.PATHS)


def test_describe_names_every_path_and_rule_or_says_none(tmp_path):
    text = GOOD.replace("CHANGES_NON_EP = False", "CHANGES_NON_EP = True")
    text = (
        text.replace("CHANGES_BATCHED = False", "CHANGES_BATCHED = True")
        + "def batched_block_size_m(**kw):\n    return 8\n"
    )
    c = contracts.load_contract(_write(tmp_path, text))
    assert c.describe() == ("contract x (PR 1): rules fused_block_size_m, batched_block_size_m; may change "
                            "non-EP fused, EP fused, batched; settings default, on")  # fmt: skip
    rules = ["fused_block_size_m", "batched_block_size_m"]
    assert c.to_json() == {"name": "x", "path": str(tmp_path / "contract.py"), "sha256": c.sha256, "rules": rules,
                           "describe": c.describe()}  # fmt: skip
    bare = GOOD.replace("CHANGES_EP = True", "CHANGES_EP = False").split("def fused_block_size_m")[0]
    assert contracts.load_contract(_write(tmp_path, bare)).describe() == (
        "contract x (PR 1): rules none; may change nothing by default; settings default, on"
    )


def test_errors_list_every_offender(tmp_path):
    with pytest.raises(UsageError, match="does not define NAME, UPSTREAM"):
        contracts.load_contract(_write(tmp_path, GOOD.replace('NAME = "x"\n', "").replace('UPSTREAM = "PR 1"\n', "")))
    two = GOOD.replace("CHANGES_EP = True", "CHANGES_EP = 1").replace("CHANGES_BATCHED = False", "CHANGES_BATCHED = 0")
    with pytest.raises(UsageError, match="CHANGES_EP, CHANGES_BATCHED must be True or False"):
        contracts.load_contract(_write(tmp_path, two))
    with pytest.raises(UsageError, match="fused_block_size_m, batched_block_size_m must be a function"):
        contracts.load_contract(_write(tmp_path, GOOD + "fused_block_size_m = 1\nbatched_block_size_m = 2\n"))


def test_contracts_of_two_folders_load_side_by_side(tmp_path):
    """Each contract runs as its own module (named after its folder), so two never share state."""
    a, b = tmp_path / "my-change", tmp_path / "other"
    a.mkdir(), b.mkdir()
    (a / "contract.py").write_text(GOOD)
    (b / "contract.py").write_text(GOOD.replace('NAME = "x"', 'NAME = "y"'))
    assert [contracts.load_contract(d / "contract.py").name for d in (a, b)] == ["x", "y"]


def test_a_recorded_relative_path_is_found_from_here_or_from_the_repository(tmp_path, monkeypatch):
    shipped = contracts.load_contract(CHANGES_DIR / "block-size-override" / "contract.py").to_json()
    monkeypatch.chdir(tmp_path)
    relative = {**shipped, "path": "ci/changes/block-size-override/contract.py"}
    assert contracts.from_manifest(relative).name == "block-size-override"  # not here: from the repository
    _write(tmp_path, GOOD)
    here = {**contracts.load_contract(tmp_path / "contract.py").to_json(), "path": "contract.py"}
    assert contracts.from_manifest(here).name == "x"  # here: this one, not the repository's
    absolute = {**shipped, "path": str(CHANGES_DIR / "block-size-override" / "contract.py")}
    assert contracts.from_manifest(absolute).name == "block-size-override"
    changed = {**here, "sha256": "0" * 64}
    with pytest.raises(UsageError, match=rf"the manifest was built \(sha256 000000000000 -> {here['sha256'][:12]}\)"):
        contracts.from_manifest(changed)

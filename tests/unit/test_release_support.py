"""Following vLLM's releases: the change as each release holds it (``releases/vllm-<version>.patch``), a patch
written for another release explained hunk by hunk, ``tests_release``'s ``--release``, and the Triton spec's
rules per release, recognised by the release's code."""

from __future__ import annotations

import pytest

from ci.core.errors import ExitCode, PatchError, UsageError
from ci.trees import build, patching
from ci.trees.sessionargs import parse_release_args
from ci.triton_moe import spec
from tests.unit.factories import MOD, diff, make_release

# three regions far apart, so a patch of all three has three hunks
LINES = [f"x{i} = {i}\n" for i in range(40)]
OLD = "".join(LINES)
NEW = OLD.replace("x2 = 2\n", "x2 = 20\n").replace("x19 = 19\n", "x19 = 190\n").replace("x37 = 37\n", "x37 = 370\n")


def _change(tmp_path, text: str = diff(MOD, OLD, NEW)):
    folder = tmp_path / "changes" / "three-hunks"
    folder.mkdir(parents=True)
    (folder / "change.patch").write_text("A preamble git ignores.\n\n" + text)
    return folder / "change.patch"


def test_each_hunk_is_cut_out_whole_even_a_removed_line_that_starts_with_dashes():
    no_newline = "--- a/vllm/other.py\n+++ b/vllm/other.py\n@@ -1,2 +1,2 @@\n p\n-q\n\\ No newline at end of file\n+r\n"
    text = diff(MOD, "a\n-- b\nc\n" + OLD, "a\nc\n" + NEW) + no_newline
    hunks = patching.split_hunks(text)
    assert [(path, header) for path, header, _ in hunks] == [
        (MOD, "@@ -1,9 +1,8 @@"),
        (MOD, "@@ -20,7 +19,7 @@"),
        (MOD, "@@ -38,6 +37,6 @@"),
        ("vllm/other.py", "@@ -1,2 +1,2 @@"),
    ]
    first = hunks[0][2]
    assert first.startswith(f"diff --git a/{MOD} b/{MOD}\n--- a/{MOD}\n+++ b/{MOD}\n@@ -1,9")
    assert "\n--- b\n" in first and "x20" not in first  # the removed "-- b" stays in its hunk, which ends there
    assert hunks[3][2] == no_newline  # a file section without a diff --git line, its "no newline" marker kept


def test_a_patch_for_another_release_says_which_hunks_the_release_holds_and_which_differ(tmp_path):
    held = NEW.replace("x36 = 36\n", "x36 = 'moved'\n").replace("x37 = 370\n", "x37 = 37\n")  # 1, 2 in; 3 moved
    release = make_release(tmp_path / "rel", text=held)
    with pytest.raises(PatchError) as err:
        build.build_trees(build.BuildOptions(patch=_change(tmp_path), out=tmp_path / "out"), release=release)
    msg = str(err.value)
    assert "written for another vLLM version; hunk by hunk: 1 '@@ -1,6 +1,6 @@'" in msg
    assert msg.count(f"of {MOD}: already in this vLLM") == 2
    assert f"3 '@@ -35,6 +35,6 @@' of {MOD}: differs (neither applies nor reverse-applies)" in msg
    assert "releases/vllm-<version>.patch beside its change.patch" in msg and "Nothing was changed" in msg
    assert not (tmp_path / "out").exists()


def test_a_hunk_that_still_applies_is_named_so(tmp_path):
    partly = OLD.replace("x2 = 2\n", "x2 = 20\n").replace("x36 = 36\n", "x36 = 'moved'\n")  # 1 in, 2 not yet, 3 moved
    release = make_release(tmp_path / "rel", text=partly)
    with pytest.raises(PatchError) as err:
        build.build_trees(build.BuildOptions(patch=_change(tmp_path), out=tmp_path / "out"), release=release)
    states = str(err.value).split("hunk by hunk: ", 1)[1]
    assert [s.split(": ", 1)[1][:9] for s in states.split("; ")[:3]] == ["already i", "applies", "differs ("]


def test_the_change_as_a_release_holds_it_is_taken_for_that_release_only(tmp_path, capsys):
    patch = _change(tmp_path)
    moved = NEW.replace("x36 = 36\n", "x36 = 'moved'\n")
    (patch.parent / "releases").mkdir()
    rebased = patch.parent / "releases" / "vllm-9.9.9.patch"
    rebased.write_text("The change on 9.9.9's code.\n\n" + diff(MOD, moved.replace("x19 = 190", "x19 = 19"), moved))
    release = make_release(tmp_path / "rel", text=moved)
    trees = build.build_trees(build.BuildOptions(patch=patch, out=tmp_path / "out"), release=release)
    out = capsys.readouterr().out
    assert "vLLM 9.9.9 has its own version of" in out and "releases/vllm-9.9.9.patch is applied instead" in out
    assert trees.manifest.reverse is True and trees.manifest.patch_path.endswith("releases/vllm-9.9.9.patch")
    assert (trees.base / MOD).read_text() == moved.replace("x19 = 190", "x19 = 19")
    assert build.patch_for_release(patch, "9.9.8") == patch  # another release: change.patch
    assert build.patch_for_release(rebased, "9.9.9") == rebased  # --patch FILE of another name: as given


def test_the_shipped_change_has_its_0_34_0_version_and_only_that():
    folder = build.DEFAULT_PATCH.parent / build.RELEASE_PATCHES
    assert sorted(p.name for p in folder.iterdir()) == ["vllm-0.34.0.patch"]
    text = (folder / "vllm-0.34.0.patch").read_text()
    assert "+        M = math.ceil(M * E / global_num_experts)" in text and "+import math" in text
    assert "input_dtype" not in text.split("diff --git", 1)[1]  # 0.34.0's code has no W4A8 left


def test_release_options():
    assert parse_release_args([], default=("newest", "0.33.0")) == (("newest", "0.33.0"), (), False)
    got = parse_release_args(["--release", "newest", "0.34.0", "-q", "--release", "0.8.5.post1", "-k", "x"], default=())
    assert got == (("newest", "0.34.0", "0.8.5.post1"), ("-q", "-k", "x"), False)
    assert parse_release_args(["-x", "--discard-envs"], default=("0.33.0",)) == (("0.33.0",), ("-x",), True)
    for bad in (["--release", "latest"], ["--release", "0.34"], ["--release", "0.35.0rc1"]):
        with pytest.raises(UsageError, match=r"expected 'newest' or a release such as 0\.34\.0") as err:
            parse_release_args(bad, default=())
        assert err.value.exit_code == ExitCode.USAGE
    assert parse_release_args(["--releas", "0.34.0"], default=("0.33.0",)) == (
        ("0.33.0",),
        ("--releas", "0.34.0"),
        False,
    )


SOURCE = """import x


def get_default_config(M, E):
    # a comment
    if M <= 16:
        return {"BLOCK_SIZE_M": 16}
    return {"BLOCK_SIZE_M": 64}


def other():
    pass
"""


def test_a_release_is_recognised_by_its_default_config_code():
    digest = spec.code_fingerprint(SOURCE)
    relaid = (
        SOURCE.replace("    # a comment\n", "")
        .replace("if M <= 16:", "if M<=16 :")
        .replace('    return {"BLOCK_SIZE_M": 64}', '\n    return {\n        "BLOCK_SIZE_M": 64}')
    )
    assert spec.code_fingerprint(relaid) == digest  # layout and comments are not the code
    assert spec.code_fingerprint(SOURCE.replace("<= 16", "<= 32")) != digest
    assert spec.code_fingerprint("def other():\n    pass\n") is None
    rules, how = spec.rules_of("0.34.0", "")
    assert rules == spec.Rules(wna16_cuda_power_of_two=True) and how == "the rules written for vLLM 0.34.0"
    assert spec.rules_of("0.26.0", "")[0] == spec.Rules()
    rules, how = spec.rules_of("0.35.0", SOURCE)
    assert rules is None and "vLLM 0.35.0's get_default_config differs" in how and "RULES in" in how


def test_a_later_release_with_0_34_0s_default_config_gets_its_rules(monkeypatch):
    monkeypatch.setitem(spec.DEFAULT_CONFIG_CODE, "0.34.0", spec.code_fingerprint(SOURCE))
    rules, how = spec.rules_of("0.35.0", SOURCE)
    assert rules == spec.RULES["0.34.0"] and how == "vLLM 0.34.0's rules: 0.35.0's get_default_config is written as its"


def test_the_wna16_cuda_config_of_each_release():
    args = dict(experts=128, n=1536, k=2048, topk=8, dtype="int4_w4a16", block_shape=[0, 128])
    assert spec.default_config(3, **args) == {"BLOCK_SIZE_M": 3, "SPLIT_K": 1}
    assert spec.default_config(3, **args, rules=spec.RULES["0.34.0"]) == {
        "BLOCK_SIZE_M": 4,
        "GROUP_SIZE_M": 1,
        "SPLIT_K": 1,
    }
    assert spec.default_config(1, **args, rules=spec.RULES["0.33.0"])["BLOCK_SIZE_M"] == 1
    assert spec.default_config(60, **args, rules=spec.RULES["0.33.0"])["BLOCK_SIZE_M"] == 16

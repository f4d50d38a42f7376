"""The vLLM-under-test builder: strict patching, reverse mode, refusals and the manifest."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from ci.core import jsonio
from ci.core.errors import DataError, PatchError, UsageError
from ci.trees import build
from ci.trees import manifest as tree_manifest
from ci.trees import release as vllm_release
from ci.trees.variants import ENTRY_MODULE
from tests.unit.factories import AFTER, BEFORE, ENTRY, MOD, diff, make_release, plain_diff


@pytest.fixture
def patch_file(tmp_path: Path) -> Path:
    p = tmp_path / "change.patch"
    p.write_text("A prose preamble git ignores.\n\n" + diff(MOD, BEFORE, AFTER))
    return p


def test_forward_build_patches_candidate_only(tmp_path, patch_file):
    release = make_release(tmp_path / "rel")
    trees = build.build_trees(build.BuildOptions(patch=patch_file, out=tmp_path / "out"), release=release)
    assert (trees.base / MOD).read_text() == BEFORE
    assert (trees.candidate / MOD).read_text() == AFTER
    assert (release.root / MOD).read_text() == BEFORE, "the release itself must never be written"
    so = trees.candidate / "vllm" / "_C.abi3.so"
    assert so.is_symlink() and so.resolve() == (release.root / "vllm" / "_C.abi3.so").resolve()
    manifest = json.loads(trees.manifest_path.read_text())
    assert manifest["kind"] == "vllm-trees" and manifest["schema_version"] == 2
    assert manifest["vllm_version"] == "9.9.9" and manifest["reverse"] is False
    assert manifest["patch_sha256"] == jsonio.sha256_file(patch_file)
    (change,) = manifest["changed_files"]
    assert change["path"] == MOD
    assert change["sha256_before"] == jsonio.sha256_file(trees.base / MOD)
    assert change["sha256_after"] == jsonio.sha256_file(trees.candidate / MOD)
    assert change["sha256_before"] != change["sha256_after"]
    assert set(manifest["tools"]) >= {"python", "git"}
    assert tree_manifest.load_trees(trees.manifest_path).manifest == trees.manifest


def test_reverse_build_removes_patch_for_base(tmp_path, patch_file):
    release = make_release(tmp_path / "rel", text=AFTER)
    opts = build.BuildOptions(patch=patch_file, out=tmp_path / "out", reverse=True)
    trees = build.build_trees(opts, release=release)
    assert (trees.base / MOD).read_text() == BEFORE
    assert (trees.candidate / MOD).read_text() == AFTER
    assert trees.manifest.reverse


def test_non_applying_patch_names_file_and_hunk_and_leaves_nothing(tmp_path, patch_file):
    release = make_release(tmp_path / "rel", text=BEFORE.replace("LIMIT = 3", "LIMIT = 4").replace("m = m\n", "x\n"))
    out = tmp_path / "out"
    with pytest.raises(PatchError) as err:
        build.build_trees(build.BuildOptions(patch=patch_file, out=out), release=release)
    msg = str(err.value)
    assert MOD in msg and "@@" in msg and "Nothing was changed" in msg
    assert "another vLLM version" in msg
    assert not out.exists(), "a failed build must leave no half-built trees"


def test_a_patch_the_release_already_holds_is_reversed_with_a_line(tmp_path, patch_file, capsys):
    """0.26.0 ships #48144: without --reverse the builder notices (forward fails, reverse applies)."""
    release = make_release(tmp_path / "rel", text=AFTER)
    trees = build.build_trees(build.BuildOptions(patch=patch_file, out=tmp_path / "out"), release=release)
    assert "already contains it, so the base is built by removing it (as --reverse)" in capsys.readouterr().out
    assert trees.manifest.reverse is True
    assert (trees.base / MOD).read_text() == BEFORE and (trees.candidate / MOD).read_text() == AFTER


def test_reverse_of_a_patch_the_release_lacks_says_drop_reverse(tmp_path, patch_file):
    release = make_release(tmp_path / "rel", text=BEFORE)
    with pytest.raises(PatchError, match="drop --reverse"):
        build.build_trees(build.BuildOptions(patch=patch_file, out=tmp_path / "out", reverse=True), release=release)


def test_missing_file_is_named(tmp_path):
    release = make_release(tmp_path / "rel")
    p = tmp_path / "other.patch"
    p.write_text(diff("vllm/layers/absent.py", BEFORE, AFTER))
    with pytest.raises(PatchError, match=r"absent\.py"):
        build.build_trees(build.BuildOptions(patch=p, out=tmp_path / "out"), release=release)


def test_patch_touching_cuda_sources_is_refused(tmp_path):
    p = tmp_path / "cuda.patch"
    p.write_text(diff("csrc/moe/marlin_moe.cu", "a\n", "b\n") + diff(MOD, BEFORE, AFTER))
    with pytest.raises(PatchError, match="full build"):
        build.build_trees(build.BuildOptions(patch=p, out=tmp_path / "out"), release=make_release(tmp_path / "r"))


def test_paths_outside_vllm_are_recorded_not_applied(tmp_path, patch_file):
    p = tmp_path / "with-tests.patch"
    p.write_text(patch_file.read_text() + diff("tests/test_mod.py", "x = 1\n", "x = 2\n"))
    trees = build.build_trees(build.BuildOptions(patch=p, out=tmp_path / "out"), release=make_release(tmp_path / "r"))
    assert trees.manifest.ignored_patch_paths == ("tests/test_mod.py",)


def test_missing_patch_and_bad_version_are_usage_errors(tmp_path):
    with pytest.raises(UsageError, match="no such file"):
        build.build_trees(build.BuildOptions(patch=tmp_path / "nope.patch"))
    with pytest.raises(UsageError, match="'latest'"):
        vllm_release.resolve_release("latest", tmp_path)


def test_not_a_patch_is_refused(tmp_path):
    p = tmp_path / "empty.patch"
    p.write_text("just words\n")
    with pytest.raises(PatchError, match="git apply finds no file in it"):
        build.build_trees(build.BuildOptions(patch=p, out=tmp_path / "o"), release=make_release(tmp_path / "r"))


def test_overlay_copies_changed_python_files(tmp_path, patch_file):
    checkout = tmp_path / "checkout"
    (checkout / "vllm" / "layers").mkdir(parents=True)
    (checkout / MOD).write_text(BEFORE.replace("LIMIT = 3", "LIMIT = 5"))
    (checkout / "vllm" / "__init__.py").write_text("")
    opts = build.BuildOptions(patch=patch_file, out=tmp_path / "out", vllm_src=checkout)
    trees = build.build_trees(opts, release=make_release(tmp_path / "rel"))
    assert trees.manifest.overlaid_files == (MOD,)
    assert "LIMIT = 5" in (trees.base / MOD).read_text() and "m // 2" in (trees.candidate / MOD).read_text()
    assert trees.manifest.overlay is None  # not a git checkout: no commit to name


def test_an_overlay_from_a_git_checkout_names_its_commit(tmp_path, patch_file):
    """A nightly run of a vLLM commit (--vllm-src CHECKOUT) records which commit it timed."""
    import subprocess

    checkout = tmp_path / "checkout"
    (checkout / "vllm" / "layers").mkdir(parents=True)
    (checkout / MOD).write_text(BEFORE.replace("LIMIT = 3", "LIMIT = 5"))
    (checkout / "vllm" / "__init__.py").write_text("")
    env = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t"}
    for argv in (["init", "-q"], ["add", "-A"], ["commit", "-qm", "Raise the limit"]):
        subprocess.run(["git", "-C", str(checkout), *argv], check=True, env={**env, "PATH": "/usr/bin:/bin"})
    sha = subprocess.run(["git", "-C", str(checkout), "rev-parse", "HEAD"], capture_output=True, text=True).stdout
    opts = build.BuildOptions(patch=patch_file, out=tmp_path / "out", vllm_src=checkout)
    trees = build.build_trees(opts, release=make_release(tmp_path / "rel"))
    assert trees.manifest.overlay == {
        "repo": str(checkout),
        "commit": sha.strip(),
        "subject": "Raise the limit",
        "status": "clean",
    }
    assert tree_manifest.load_trees(trees.manifest_path).manifest.overlay == trees.manifest.overlay
    (checkout / MOD).write_text(BEFORE)
    again = build.build_trees(replace(opts, out=tmp_path / "out2"), release=make_release(tmp_path / "rel2"))
    assert again.manifest.overlay["status"] == "uncommitted changes"


def test_load_trees_refuses_corrupt_and_foreign_files(tmp_path):
    bad = tmp_path / "manifest.json"
    bad.write_text("{not json")
    with pytest.raises(DataError, match="not valid JSON"):
        tree_manifest.load_trees(bad)
    bad.write_text(json.dumps({"kind": "vllm-trees", "schema_version": 99}))
    with pytest.raises(DataError, match="schema_version=99"):
        tree_manifest.load_trees(bad)
    bad.write_text(json.dumps({"kind": "kernel-bench", "schema_version": 1}))
    with pytest.raises(DataError, match="expected a 'vllm-trees' file"):
        tree_manifest.load_trees(bad)


def test_installed_version_read_without_import(tmp_path, monkeypatch):
    import importlib.machinery

    make_release(tmp_path / "site", version="1.2.3")
    site = str(tmp_path / "site")  # look only there, whatever this process imported already
    monkeypatch.setattr(
        vllm_release.importlib.util, "find_spec", lambda n: importlib.machinery.PathFinder.find_spec(n, [site])
    )
    release = vllm_release.locate_installed()
    assert release.version == "1.2.3" and release.root == (tmp_path / "site").resolve()


def test_shipped_patch_is_the_pr_hunk():
    text = build.DEFAULT_PATCH.read_text()
    assert "+import math" in text
    assert "+        M = math.ceil(M * E / global_num_experts)" in text
    assert text.count("diff --git") == 1


@pytest.mark.network
def test_shipped_patch_reverse_applies_to_vllm_0_26_0(tmp_path):
    """Upstream 0.26.0 contains the hunk: the patch reverse-applies to its file (wheel from the index)."""
    release = vllm_release.fetch_release("0.26.0", build.GATE_DIR / "cache")
    opts = build.BuildOptions(patch=build.DEFAULT_PATCH, out=tmp_path / "out", reverse=True)
    trees = build.build_trees(opts, release=release)
    text = (trees.base / trees.manifest.changed_files[0].path).read_text()
    assert "import math" not in text and "math.ceil" not in text


def test_slug_names_the_build():
    name = build.tree_slug("0.26.0", Path("x/marlin.patch"), reverse=True, src=False)
    assert name == "vllm-0.26.0-marlin-reverse"
    assert build.tree_slug("0.25.1", Path("p.patch"), reverse=False, src=True) == "vllm-0.25.1-src-p"


def test_a_dependency_the_release_imports_is_one_clear_error(tmp_path, monkeypatch):
    """vLLM 0.33.0 on 0.25.1's environment: `No module named 'pybase64'` in every test before; now one line
    naming the module, its package, the release and the fix, with the environment error's exit code."""
    import subprocess
    import sys

    release = make_release(tmp_path / "rel", version="0.33.0")
    entry = release.root / ENTRY
    for pkg in (
        "model_executor",
        "model_executor/layers",
        "model_executor/layers/fused_moe",
        "model_executor/layers/fused_moe/experts",
    ):
        (release.root / "vllm" / pkg / "__init__.py").write_text("")
    entry.write_text("import cpuinfo_not_installed_here\nfrom vllm.layers import mod\n")
    patch = tmp_path / "p.patch"
    patch.write_text(diff(MOD, BEFORE, AFTER))
    trees = build.build_trees(build.BuildOptions(patch=patch, out=tmp_path / "trees"), release=release)
    code = (
        "import sys; from ci.trees.manifest import load_trees\n"
        "from ci.trees.variants import put_base_first, check_base_importable\n"
        f"t = load_trees(__import__('pathlib').Path({str(trees.manifest_path)!r})); put_base_first(t)\n"
        "from ci.core.cli import run_main\nsys.exit(run_main(lambda argv: check_base_importable(t) and 0, []))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=Path(build.__file__).parents[2]
    )
    assert done.returncode == 9, done.stderr
    err = done.stdout + done.stderr
    assert (
        "vLLM 0.33.0" in err
        and "'cpuinfo_not_installed_here'" in err
        and "pip install cpuinfo-not-installed-here" in err
        and "nox -s tests_release -- --release 0.33.0" in err
    )
    assert "Traceback" not in err
    for workers in ([], ["-n", "2"]):  # in the process, or (xdist) in a check of its own beside the workers
        tests = subprocess.run(
            [
                sys.executable,
                "-m",
                "pytest",
                "-q",
                "-p",
                "no:cacheprovider",
                "--gate-manifest",
                str(trees.manifest_path),
                "tests/unit/test_spec.py",
                *workers,
            ],
            capture_output=True,
            text=True,
            cwd=Path(build.__file__).parents[2],
        )
        out = tests.stdout + tests.stderr
        assert tests.returncode == 9 and out.count("imports 'cpuinfo_not_installed_here'") == 1, (workers, out)
        assert " passed" not in out and " failed" not in out  # stopped before any test ran


def test_a_change_is_picked_by_name_and_brings_its_contract(tmp_path):
    assert build.patch_of(None, None) == build.DEFAULT_PATCH
    assert build.patch_of("block-size-override", None) == build.CHANGES_DIR / "block-size-override" / "change.patch"
    with pytest.raises(UsageError, match="give one"):
        build.patch_of("block-size-override", tmp_path / "x.patch")
    changes = "batched-large-tile, batched-tile-from-load, block-size-override, marlin-ep"
    with pytest.raises(UsageError, match=f"the changes are {changes}"):
        build.patch_of("nope", None)
    opts = build.BuildOptions(patch=build.CHANGES_DIR / "block-size-override" / "change.patch")
    assert build.resolve_contract(opts)["name"] == "block-size-override"
    assert build.resolve_contract(build.BuildOptions(patch=opts.patch, contract="none")) is None
    assert build.resolve_contract(build.BuildOptions(patch=tmp_path / "bare.patch")) is None  # none beside it
    given = build.BuildOptions(patch=tmp_path / "bare.patch", contract=str(build.CHANGES_DIR / DEFAULT_CONTRACT))
    assert build.resolve_contract(given)["rules"] == ["fused_block_size_m"]


DEFAULT_CONTRACT = "marlin-ep-m-estimate/contract.py"


# What the candidate runs is what differs between the trees (ci.trees.treediff), not what a patch's headers say.

ALIGN = "vllm/layers/align.py"  # a second module the entry imports (as marlin_moe imports moe_align_block_size)


def _release_with(root: Path, files: dict[str, str], entry: str) -> vllm_release.Release:
    release = make_release(root)
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    (root / ENTRY).write_text(entry)
    return release


def test_a_hidden_plain_section_is_listed_and_loaded_from_the_candidate(tmp_path):
    """Issue 21, item 1: a harmless git-format hunk, then a plain unified diff of the aligner. The manifest
    listed only the first file and the candidate ran the base's aligner (67 passed on the H200)."""
    from ci.trees import variants

    release = _release_with(
        tmp_path / "rel",
        {ALIGN: "def align(x):\n    return x\n"},
        entry="from vllm.layers import mod\nfrom vllm.layers.align import align\n",
    )
    patch = tmp_path / "hidden.patch"
    patch.write_text(
        diff(MOD, BEFORE, BEFORE.replace("import os\n", "import os  # a comment\n"))
        + plain_diff(ALIGN, "def align(x):\n    return x\n", "def align(x):\n    return None\n")
    )
    trees = build.build_trees(build.BuildOptions(patch=patch, out=tmp_path / "out"), release=release)
    assert [c.path for c in trees.manifest.changed_files] == [ALIGN, MOD]
    assert variants.candidate_modules(trees.manifest.changed_files, trees.candidate, source="p") == [
        "vllm.layers.align",
        "vllm.layers.mod",
        ENTRY_MODULE,
    ]


def test_a_path_with_b_slash_is_named_not_ignored(tmp_path):
    """``diff --git a/vllm/x b/y.py b/vllm/x b/y.py``: the header parser took ``y.py b/vllm/x b/y.py``, outside
    vllm/, as ignored; git created the file in the candidate. Now the tree diff names it, and the build
    refuses it: no module of the Marlin path imports it."""
    odd = "vllm/x b/y.py"
    release = _release_with(tmp_path / "rel", {odd: "X = 1\n"}, entry="from vllm.layers import mod\n")
    patch = tmp_path / "odd.patch"
    patch.write_text(diff(MOD, BEFORE, AFTER) + diff(odd, "X = 1\n", "X = 2\n"))
    with pytest.raises(PatchError, match=r"vllm/x b/y\.py is not imported by vllm\.model_executor") as err:
        build.build_trees(build.BuildOptions(patch=patch, out=tmp_path / "out"), release=release)
    assert "Nothing was changed" in str(err.value)
    assert not (tmp_path / "out").exists()


def test_a_change_reached_only_through_an_unchanged_module_is_refused_with_the_chain(tmp_path):
    deep = "vllm/layers/deep.py"
    middle = {"vllm/layers/middle.py": "from vllm.layers import deep\n"}
    entry = "from vllm.layers import mod, middle\n"
    release = _release_with(tmp_path / "rel", {deep: "K = 1\n", **middle}, entry=entry)
    patch = tmp_path / "deep.patch"
    patch.write_text(diff(MOD, BEFORE, AFTER) + plain_diff(deep, "K = 1\n", "K = 2\n"))
    with pytest.raises(PatchError) as err:
        build.build_trees(build.BuildOptions(patch=patch, out=tmp_path / "out"), release=release)
    assert (
        f"vllm/layers/deep.py is imported only through unchanged modules ({ENTRY_MODULE} -> vllm.layers.middle "
        "-> vllm.layers.deep), which keep the base's, so the candidate would never run it"
    ) in str(err.value)


def test_comments_docstrings_and_layout_out_of_the_candidates_reach_are_built_not_refused(tmp_path):
    """A change of comments, a docstring or layout alone changes no code the candidate runs: the build takes it
    (vLLM's history is full of them, and a bisect steps over them), where a change of code there is refused."""
    deep = "vllm/layers/deep.py"
    middle = {"vllm/layers/middle.py": "from vllm.layers import deep\n"}
    entry = "from vllm.layers import mod, middle\n"
    before = '"""Deep."""\nK = 1\n'
    release = _release_with(tmp_path / "rel", {deep: before, **middle}, entry=entry)
    patch = tmp_path / "deep.patch"
    text_only = '"""Deep, reworded."""\n# a comment\nK = (\n    1\n)\n'
    patch.write_text(diff(MOD, BEFORE, AFTER) + plain_diff(deep, before, text_only))
    trees = build.build_trees(build.BuildOptions(patch=patch, out=tmp_path / "out"), release=release)
    assert [c.path for c in trees.manifest.changed_files] == [deep, MOD]
    code = tmp_path / "code.patch"
    code.write_text(diff(MOD, BEFORE, AFTER) + plain_diff(deep, before, '"""Deep."""\nK = 2\n'))
    with pytest.raises(PatchError, match=r"vllm/layers/deep\.py is imported only through unchanged modules"):
        build.build_trees(build.BuildOptions(patch=code, out=tmp_path / "out2"), release=release)


def test_a_symlink_the_patch_adds_is_refused_and_the_host_file_never_read(tmp_path, patch_file):
    """Issue 21, item 6: a symbolic link to a host file, created by git apply, was hashed into the manifest."""
    host = tmp_path / "host-secret"
    host.write_text("secret")
    link = patch_file.parent / "link.patch"
    link.write_text(
        patch_file.read_text() + f"diff --git a/vllm/layers/leak.py b/vllm/layers/leak.py\nnew file mode "
        f"120000\n--- /dev/null\n+++ b/vllm/layers/leak.py\n@@ -0,0 +1 @@\n+{host}\n\\ No newline at end "
        "of file\n"
    )
    with pytest.raises(PatchError, match=rf"puts symbolic links into vLLM \(vllm/layers/leak.py -> {host}\)"):
        build.build_trees(build.BuildOptions(patch=link, out=tmp_path / "out"), release=make_release(tmp_path / "r"))


def test_trees_changed_after_the_build_are_refused(tmp_path, patch_file):
    from ci.trees import variants

    trees = build.build_trees(
        build.BuildOptions(patch=patch_file, out=tmp_path / "out"), release=make_release(tmp_path / "rel")
    )
    (trees.candidate / "vllm" / "layers" / "extra.py").write_text("X = 1\n")
    with pytest.raises(DataError, match=r"no longer differ as the manifest records \(now: vllm/layers/extra.py, "):
        variants.load_candidate(trees)


def test_the_tree_diff_sees_content_mode_links_added_and_removed(tmp_path):
    from ci.trees import treediff

    base, cand = tmp_path / "b", tmp_path / "c"
    for tree in (base, cand):
        (tree / "vllm").mkdir(parents=True)
        (tree / "vllm" / "same.py").write_text("x\n")
        (tree / "vllm" / "mode.py").write_text("x\n")
        (tree / "vllm" / "data.json").symlink_to(tmp_path / "release.json")
    (tmp_path / "release.json").write_text("{}")
    (base / "vllm" / "content.py").write_text("a\n")
    (cand / "vllm" / "content.py").write_text("b\n")
    (cand / "vllm" / "mode.py").chmod(0o755)
    (base / "vllm" / "gone.py").write_text("x\n")
    (cand / "vllm" / "new.py").write_text("x\n")
    (cand / "vllm" / "link.py").symlink_to("/etc/hostname")
    (base / "vllm" / "copied.json").symlink_to(tmp_path / "release.json")  # a link the builder copied out
    (cand / "vllm" / "copied.json").write_text("{}")
    found = {c.path: c.what for c in treediff.differences(base, cand)}
    assert found == {
        "vllm/content.py": "modified",
        "vllm/mode.py": "mode",
        "vllm/gone.py": "removed",
        "vllm/new.py": "added",
        "vllm/link.py": "link",
    }


def test_the_sessions_take_the_stages_source_options_and_pass_on_exactly_those_given():
    import argparse

    from ci.trees.sessionargs import parse_session_args

    args = parse_session_args(["--patch", "p.patch", "--contract", "none", "--reverse", "-n", "4", "--out", "o"])
    expected = ("--vllm", vllm_release.DEFAULT_VLLM, "--patch", "p.patch", "--contract", "none", "--reverse")
    assert args.build_argv == expected
    assert args.rest == ("-n", "4") and args.out == "o"
    flags = [a.option_strings[0] for a in build.add_source_arguments(argparse.ArgumentParser())]
    for flag in flags:
        given = [flag] if flag == "--reverse" else [flag, "x"]
        assert parse_session_args(given).build_argv[-len(given) :] == tuple(given), flag


def _triton_only_change(tmp_path):
    """A release with a module only Triton's fused_moe imports, a patch of that module, and Triton's entry."""
    from ci.trees import variants

    triton = variants.ENTRY_MODULES[1]
    other = "vllm/layers/other.py"
    release = _release_with(
        tmp_path / "rel",
        {other: "K = 1\n", triton.replace(".", "/") + ".py": "from vllm.layers import other\n"},
        entry="from vllm.layers import mod\n",
    )
    patch = tmp_path / "other.patch"
    patch.write_text(diff(other, "K = 1\n", "K = 2\n"))
    return release, patch, triton


def test_the_entry_module_is_the_contracts_or_the_subject_entry_that_runs_the_change(tmp_path):
    """A change of a module only Triton's fused_moe imports is loaded through it (recorded in the manifest);
    one Marlin's entry imports stays Marlin's; a contract that declares Marlin's refuses the Triton one."""
    from ci.trees import variants

    release, patch, triton = _triton_only_change(tmp_path)
    trees = build.build_trees(build.BuildOptions(patch=patch, contract="none", out=tmp_path / "t"), release=release)
    assert trees.manifest.entry_module == triton == variants.entry_module(trees)
    mine = tmp_path / "mod.patch"
    mine.write_text(diff(MOD, BEFORE, AFTER))
    marlin = build.build_trees(build.BuildOptions(patch=mine, contract="none", out=tmp_path / "m"), release=release)
    assert marlin.manifest.entry_module == ENTRY_MODULE == variants.entry_module(marlin)
    with pytest.raises(PatchError, match=r"vllm/layers/other\.py is not imported by vllm\.model_executor.*marlin_moe"):
        variants.choose_entry(trees.manifest.changed_files, trees.candidate, source="p", declared=ENTRY_MODULE)
    assert variants.choose_entry(trees.manifest.changed_files, trees.candidate, source="p", declared=triton) == triton


def test_a_bisect_step_declares_every_path_and_chooses_the_entry_as_without_a_contract(tmp_path):
    """Issue 41, on the H100: the bisect built its steps without a contract, so a commit that moves the tile
    threshold (and so the non-EP tile) was refused by the bench as an undeclared non-EP change, and the bisect
    stopped. A step's contract (``ci/runner/bisect-contract.py``) declares every path, checks no rule and lets
    the build choose the entry module as without a contract (Triton's, for a module only it imports)."""
    from ci.runner.bisect import STEP_CONTRACT
    from ci.trees import contracts, variants

    step = contracts.load_contract(STEP_CONTRACT)
    assert [contracts.may_change(step, p) for p in contracts.PATHS] == [True, True, True]
    assert step.rules == [] and step.entry_module is None and step.settings == {contracts.DEFAULT_SETTING: {}}
    release, patch, triton = _triton_only_change(tmp_path)
    opts = build.BuildOptions(patch=patch, contract=str(STEP_CONTRACT), out=tmp_path / "t")
    trees = build.build_trees(opts, release=release)
    assert trees.manifest.entry_module == triton == variants.entry_module(trees)
    recorded = contracts.from_manifest(trees.manifest.contract)
    assert recorded.name == "between-commits" and contracts.may_change(recorded, "non_ep")  # as ci.kernel.bench does

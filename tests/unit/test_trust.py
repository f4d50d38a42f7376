"""The GPU workflows' trust checks, the job-summary mapping and branch patches, without GitHub or a GPU."""

from __future__ import annotations

import http.server
import json
import subprocess
import threading
from pathlib import Path

import pytest

from ci.core.cli import run_main
from ci.core.errors import ExitCode, PatchError, UntrustedError, UsageError
from ci.runner import jobsummary, trust
from ci.trees import branch, build, manifest, refpatch
from tests.unit.factories import make_release

REVIEWED = "a" * 40
PUSHED = "b" * 40


@pytest.fixture
def github_api(monkeypatch):
    """A stand-in for the REST API's GET /repos/{repo}/pulls/{n}: PR 7 is open at REVIEWED."""
    pulls = {7: {"state": "open", "head": {"sha": REVIEWED}}, 8: {"state": "closed", "head": {"sha": REVIEWED}}}
    seen = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            seen.append((self.path, self.headers.get("Authorization")))
            number = int(self.path.rsplit("/", 1)[1]) if self.path.startswith("/repos/o/r/pulls/") else 0
            body = pulls.get(number)
            self.send_response(200 if body else 404)
            self.end_headers()
            self.wfile.write(json.dumps(body or {"message": "Not Found"}).encode())

        def log_message(self, *args):
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    monkeypatch.setenv("GITHUB_API_URL", f"http://127.0.0.1:{server.server_port}")
    monkeypatch.setenv("GITHUB_TOKEN", "t0ken")
    yield seen
    server.shutdown()


def test_reviewed_head_passes_and_is_written_as_the_sha_to_test(github_api, tmp_path, monkeypatch):
    out = tmp_path / "out"
    monkeypatch.setenv("GITHUB_OUTPUT", str(out))
    args = ["verify-pr", "--repository", "o/r", "--pr", "7", "--sha", REVIEWED]
    assert run_main(trust.main, args) == 0
    assert out.read_text() == f"sha={REVIEWED}\n"
    assert github_api == [("/repos/o/r/pulls/7", "Bearer t0ken")]


def test_a_head_pushed_after_review_stops_the_run(github_api, tmp_path, monkeypatch, capsys):
    out = tmp_path / "out"
    monkeypatch.setenv("GITHUB_OUTPUT", str(out))
    args = ["verify-pr", "--repository", "o/r", "--pr", "7", "--sha", PUSHED]
    assert run_main(trust.main, args) == ExitCode.UNTRUSTED
    assert f"its head is {REVIEWED}, not the reviewed {PUSHED}" in capsys.readouterr().err
    assert not out.exists(), "no SHA to test may be handed on"
    assert run_main(trust.main, ["verify-pr", "--repository", "o/r", "--pr", "8", "--sha", REVIEWED]) == 13
    assert run_main(trust.main, ["verify-pr", "--repository", "o/r", "--pr", "9", "--sha", REVIEWED]) == 13


@pytest.mark.parametrize(
    "args",
    [
        ["--repository", "o/r", "--pr", "7", "--sha", "abc"],
        ["--repository", "o/r", "--pr", "x", "--sha", REVIEWED],
        ["--repository", "o r", "--pr", "7", "--sha", REVIEWED],
        ["--repository", "o/r", "--pr", "0", "--sha", REVIEWED],
    ],
)
def test_malformed_dispatch_inputs_are_usage_errors(args):
    assert run_main(trust.main, ["verify-pr", *args]) == ExitCode.USAGE


def test_verify_pr_logic():
    assert trust.verify_pr({"state": "open", "head": {"sha": REVIEWED}}, repository="o/r", number=1, sha=REVIEWED)
    with pytest.raises(UntrustedError, match="not open"):
        trust.verify_pr({"state": "closed", "head": {"sha": REVIEWED}}, repository="o/r", number=1, sha=REVIEWED)
    with pytest.raises(UntrustedError, match="No code of the pull request was checked out"):
        trust.verify_pr({"state": "open", "head": {}}, repository="o/r", number=1, sha=REVIEWED)


def test_check_ref_is_a_tripwire(tmp_path, monkeypatch):
    monkeypatch.setenv("GITHUB_OUTPUT", str(tmp_path / "o"))
    assert (
        run_main(
            trust.main, ["check-ref", "--ref", "refs/heads/main", "--allowed", "refs/heads/main", "--sha", REVIEWED]
        )
        == 0
    )
    assert (tmp_path / "o").read_text() == f"sha={REVIEWED}\n"
    args = ["check-ref", "--ref", "refs/heads/evil", "--allowed", "refs/heads/main"]
    assert run_main(trust.main, args) == ExitCode.UNTRUSTED


@pytest.mark.parametrize(
    ("code", "name", "status", "level"),
    [
        (0, "PASS", 0, "notice"),
        (1, "FAIL", 1, "error"),
        (3, "INCONCLUSIVE", 3, "error"),
        (4, "NO_BASELINE", 0, "warning"),
        (10, "INCOMPLETE", 10, "error"),
        (6, "NO_GPU", 6, "error"),
        (70, "INTERNAL", 70, "error"),
        (130, "INTERRUPTED", 130, "error"),
        (99, "EXIT_99", 99, "error"),
    ],
)
def test_job_summary_names_the_verdict_and_sets_the_job_status(
    code, name, status, level, tmp_path, monkeypatch, capsys
):
    summary = tmp_path / "summary.md"
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
    assert jobsummary.main(["--stage", "kernel gate", "--exit-code", str(code)]) == status
    assert f"### kernel gate: **{name}**" in summary.read_text()
    assert capsys.readouterr().out.startswith(f"::{level} title={name}::kernel gate: {name} (exit {code})")


def test_strict_makes_a_missing_baseline_fail_the_job():
    assert jobsummary.main(["--stage", "s", "--exit-code", "4", "--strict"]) == 4
    assert {jobsummary.describe(int(c))[0] for c in ExitCode} == {n for n, _ in jobsummary.MEANING.values()}


# a contributor's branch as the patch ---------------------------------------------------------------


def _git(repo: Path, *args: str) -> str:
    env = {
        "GIT_AUTHOR_NAME": "t",
        "GIT_AUTHOR_EMAIL": "t@t",
        "GIT_COMMITTER_NAME": "t",
        "GIT_COMMITTER_EMAIL": "t@t",
        "HOME": str(repo),
        "PATH": "/usr/bin:/bin",
    }
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True, env=env).stdout


@pytest.fixture
def fork(tmp_path) -> Path:
    """A vLLM-like repository: main, then a branch that changes vllm/ and tests/ (main moves on meanwhile)."""
    repo = tmp_path / "vllm-fork"
    (repo / "vllm" / "layers").mkdir(parents=True)
    (repo / "tests").mkdir()
    (repo / "vllm" / "__init__.py").write_text("")
    (repo / "vllm" / "layers" / "mod.py").write_text("def pick(m):\n    return m\n")
    (repo / "tests" / "test_mod.py").write_text("x = 1\n")
    _git(repo, "init", "-q", "-b", "main")
    _git(repo, "add", ".")
    _git(repo, "commit", "-qm", "base")
    _git(repo, "checkout", "-qb", "feature")
    (repo / "vllm" / "layers" / "mod.py").write_text("def pick(m):\n    return m // 2\n")
    (repo / "tests" / "test_mod.py").write_text("x = 2\n")
    _git(repo, "commit", "-qam", "feature")
    _git(repo, "checkout", "-q", "main")
    (repo / "README.md").write_text("main moved on\n")
    _git(repo, "add", ".")
    _git(repo, "commit", "-qm", "later on main")
    return repo


def test_branch_patch_is_the_merge_base_diff_under_vllm_and_builds(fork, tmp_path, capsys):
    out = tmp_path / "change.patch"
    assert run_main(refpatch.main, ["--repo", str(fork), "--base", "main", "--head", "feature", "--out", str(out)]) == 0
    text = out.read_text()
    head = _git(fork, "rev-parse", "feature").strip()
    assert f"head feature = {head}" in text and "vllm/layers/mod.py" in text and "README.md" not in text
    assert (
        "tests/test_mod.py" not in text and "left out (not under vllm/): tests/test_mod.py" in capsys.readouterr().out
    )
    release = make_release(tmp_path / "rel", text="def pick(m):\n    return m\n")
    trees = build.build_trees(build.BuildOptions(patch=out, out=tmp_path / "trees"), release=release)
    assert "m // 2" in (trees.candidate / "vllm" / "layers" / "mod.py").read_text()
    assert "m // 2" not in (trees.base / "vllm" / "layers" / "mod.py").read_text()


def test_branch_changing_compiled_sources_or_nothing_is_refused(fork, tmp_path):
    _git(fork, "checkout", "-q", "feature")
    (fork / "csrc").mkdir()
    (fork / "csrc" / "marlin.cu").write_text("// kernel\n")
    _git(fork, "add", ".")
    _git(fork, "commit", "-qm", "kernel")
    with pytest.raises(PatchError, match=r"changes compiled sources \(csrc/marlin.cu\)"):
        refpatch.make_patch(fork, "main", "feature")
    _git(fork, "checkout", "-qb", "docs-only", "main")
    (fork / "README.md").write_text("docs\n")
    _git(fork, "commit", "-qam", "docs")
    with pytest.raises(PatchError, match="changes nothing under vllm/"):
        refpatch.make_patch(fork, "main", "docs-only")
    assert run_main(refpatch.main, ["--repo", str(fork), "--base", "main", "--head", "nope", "--out", "x"]) == 2


def test_build_from_refs_overlays_the_merge_base_and_records_the_branch(fork, tmp_path, monkeypatch):
    """`--vllm-src FORK --base-ref main --head-ref feature`: base = release + vllm/ at the merge-base,
    candidate = base + the branch's diff; the manifest names both refs and the patch made from them."""
    monkeypatch.chdir(tmp_path)  # the builder's own folder (.gate/refs) goes here
    (fork / "vllm" / "layers" / "mod.py").write_text("def pick(m):\n    return m  # main, uncommitted\n")
    release = make_release(tmp_path / "rel", text="def pick(m):\n    return m + 0  # release\n")
    opts = build.BuildOptions(vllm_src=fork, base_ref="main", head_ref="feature", out=tmp_path / "trees")
    trees = build.build_trees(opts, release=release)
    assert (trees.base / "vllm/layers/mod.py").read_text() == "def pick(m):\n    return m\n", "the merge-base's file"
    assert (trees.candidate / "vllm/layers/mod.py").read_text() == "def pick(m):\n    return m // 2\n"
    refs = trees.manifest.refs
    assert refs["head_sha"] == _git(fork, "rev-parse", "feature").strip() and refs["base"] == "main"
    assert refs["files"] == ["vllm/layers/mod.py"] and refs["left_out"] == ["tests/test_mod.py"]
    assert trees.manifest.patch_path.endswith("change.patch") and "merge-base" in trees.manifest.vllm_source
    assert manifest.load_trees(trees.manifest_path).manifest.refs == refs
    assert (fork / "vllm" / "layers" / "mod.py").read_text().endswith("uncommitted\n"), "the checkout is untouched"
    again = build.build_trees(opts, release=release)  # the exported folder is the builder's: rebuilt in place
    assert again.manifest.refs == refs


def test_refs_need_a_checkout_and_make_their_own_patch(fork, tmp_path):
    with pytest.raises(UsageError, match="give it with --vllm-src"):
        build.build_trees(build.BuildOptions(head_ref="feature"))
    with pytest.raises(UsageError, match="leave out --patch and --reverse"):
        build.build_trees(build.BuildOptions(vllm_src=fork, head_ref="feature", reverse=True))
    foreign = tmp_path / "not-mine"
    foreign.mkdir()
    (foreign / "keep.txt").write_text("keep")
    with pytest.raises(UsageError, match="was not made by the builder"):
        branch.export_vllm(fork, "main", foreign)
    assert (foreign / "keep.txt").read_text() == "keep"


def test_session_args_pass_the_refs_to_the_builder():
    from ci.trees.sessionargs import parse_session_args

    args = parse_session_args(["--vllm-src", "fork", "--base-ref", "origin/main", "--head-ref", "HEAD", "-k", "x"])
    assert args.build_argv == (
        "--vllm",
        "0.25.1",
        "--vllm-src",
        "fork",
        "--base-ref",
        "origin/main",
        "--head-ref",
        "HEAD",
    )
    assert args.rest == ("-k", "x")


# The branch mode does not depend on the user's environment (issue 21, item 6) -------------------------


def test_the_users_git_configuration_does_not_change_the_branch_patch(fork, tmp_path, monkeypatch):
    """diff.noprefix or color.diff=always in the user's (or the repository's) configuration wrote a patch
    git apply could not read (a misleading exit 5)."""
    home = tmp_path / "home"
    home.mkdir()
    (home / ".gitconfig").write_text(
        "[diff]\n\tnoprefix = true\n\tmnemonicPrefix = true\n[color]\n\tdiff = always\n"
        "\tui = always\n[core]\n\tquotepath = true\n"
    )
    monkeypatch.setenv("HOME", str(home))
    _git(fork, "config", "diff.noprefix", "true")
    _git(fork, "config", "color.diff", "always")
    text, _ = refpatch.make_patch(fork, "main", "feature")
    assert "diff --git a/vllm/layers/mod.py b/vllm/layers/mod.py" in text and "\x1b[" not in text
    release = make_release(tmp_path / "rel", text="def pick(m):\n    return m\n")
    patch = tmp_path / "p.patch"
    patch.write_text(text)
    trees = build.build_trees(build.BuildOptions(patch=patch, out=tmp_path / "trees"), release=release)
    assert "m // 2" in (trees.candidate / "vllm" / "layers" / "mod.py").read_text()


def _commit_on(repo: Path, branch: str, path: str, make) -> None:
    """``make(repo / path)`` on ``branch``, committed."""
    _git(repo, "checkout", "-q", branch)
    (repo / path).parent.mkdir(parents=True, exist_ok=True)
    make(repo / path)
    _git(repo, "add", ".")
    _git(repo, "commit", "-qm", f"add {path}")


def test_a_file_that_is_not_utf8_is_refused_with_its_path(fork):
    _commit_on(fork, "feature", "vllm/layers/latin.py", lambda p: p.write_bytes("# caf\xe9\n".encode("latin-1")))
    with pytest.raises(PatchError, match=r"vllm/layers/latin.py at [0-9a-f]{12} is not UTF-8 text"):
        refpatch.make_patch(fork, "main", "feature")


def test_symbolic_links_in_the_branch_or_at_the_merge_base_are_refused(fork, tmp_path):
    _commit_on(fork, "feature", "vllm/layers/leak.py", lambda p: p.symlink_to("/etc/passwd"))
    with pytest.raises(PatchError, match=r"holds symbolic links under vllm/ \(vllm/layers/leak.py\)"):
        refpatch.make_patch(fork, "main", "feature")
    _commit_on(fork, "main", "vllm/abs.py", lambda p: p.symlink_to("/etc/hostname"))  # at the merge-base
    dest = tmp_path / "export"
    with pytest.raises(PatchError, match=r"vllm/abs.py at main of .* is not a file \(mode 120000"):
        branch.export_vllm(fork, "main", dest)
    assert not dest.exists()


@pytest.mark.parametrize(
    "path",
    [
        "csrc/moe/marlin.cxx",
        "vllm/kernels/k.hip",
        "vllm/k.cubin",
        "csrc/moe/CMakeLists.txt",
        "vllm/third_party/CMakeLists.txt",
    ],
)
def test_every_compiled_source_is_refused(fork, path):
    _commit_on(fork, "feature", path, lambda p: p.write_text("compiled\n"))
    with pytest.raises(PatchError, match=rf"changes compiled sources \({path}\)"):
        refpatch.make_patch(fork, "main", "feature")


def test_the_export_takes_blobs_as_stored_not_as_gitattributes_say(fork, tmp_path):
    _git(fork, "checkout", "-q", "main")
    (fork / ".gitattributes").write_text("vllm/layers/mod.py export-ignore\n")
    _git(fork, "add", ".")
    _git(fork, "commit", "-qm", "attributes")
    branch.export_vllm(fork, "main", tmp_path / "export")
    assert (tmp_path / "export" / "vllm" / "layers" / "mod.py").read_text() == "def pick(m):\n    return m\n"


# Strict types, one-line outputs, normalised numbers (issue 21, item 8) ---------------------------------


@pytest.mark.parametrize("pr", ["012", "١٢", "+12", "12\n", "0"])
def test_a_pr_number_is_written_as_in_its_url(pr, capsys):
    args = ["verify-pr", "--repository", "o/r", "--pr", pr, "--sha", REVIEWED]
    assert run_main(trust.main, args) == ExitCode.USAGE
    assert "expected a pull request number as written in its URL" in capsys.readouterr().err


def test_outputs_are_one_line_each(tmp_path, monkeypatch, capsys):
    out = tmp_path / "out"
    monkeypatch.setenv("GITHUB_OUTPUT", str(out))
    args = ["check-ref", "--ref", "refs/heads/main", "--allowed", "refs/heads/main", "--sha", REVIEWED + "\nx=1"]
    assert run_main(trust.main, args) == ExitCode.USAGE
    assert not out.exists()
    bad_sha = ["verify-pr", "--repository", "o/r", "--pr", "7", "--sha", REVIEWED + "\n"]
    assert run_main(trust.main, bad_sha) == ExitCode.USAGE
    assert run_main(trust.main, ["verify-pr", "--repository", "o/r\n", "--pr", "7", "--sha", REVIEWED]) == 2


@pytest.mark.parametrize("code", ["256", "-1", "1e1", "٣"])
def test_an_exit_status_outside_0_to_255_is_refused_not_read_as_success(code):
    with pytest.raises(SystemExit) as done:
        jobsummary.main(["--stage", "s", "--exit-code", code])
    assert done.value.code == 2


def test_a_stage_killed_by_a_signal_is_named_for_it_never_fail(capsys):
    assert jobsummary.describe(137)[0] == "KILLED" and jobsummary.describe(143)[0] == "SIGNAL_15"
    assert jobsummary.main(["--stage", "bench\n::notice::x", "--exit-code", "137"]) == 137
    out = capsys.readouterr().out
    assert out.startswith("::error title=KILLED::bench ::notice::x: KILLED (exit 137)") and out.count("\n") == 1


def test_the_default_base_ref_is_the_first_the_checkout_has_or_a_clear_error(fork):
    """`--base-ref origin/main` failed with a raw git error in a fork clone."""
    with pytest.raises(UsageError, match=r"none of v0.25.1, origin/main, upstream/main is a commit there"):
        branch.default_base_ref(fork, "0.25.1")
    _git(fork, "update-ref", "refs/remotes/upstream/main", "main")  # a fork clone: vLLM is "upstream"
    assert branch.default_base_ref(fork, "0.25.1") == "upstream/main"
    _git(fork, "tag", "v0.25.1", "main")
    assert branch.default_base_ref(fork, "0.25.1") == "v0.25.1"
    assert branch.default_base_ref(fork, "installed") == "upstream/main"
    with pytest.raises(UsageError, match=r"--base-ref origin/main: not a commit of .* try upstream/main"):
        refpatch.make_patch(fork, "origin/main", "feature")

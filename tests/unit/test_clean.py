"""nox -s clean: what .gate holds, with sizes; removing only what is named and what the gate made."""

from __future__ import annotations

import pytest

from ci.core.errors import UsageError
from ci.trees import clean


def _gate(tmp_path):
    root = tmp_path / ".gate"
    (root / "cache" / "vllm-0.25.1").mkdir(parents=True)
    (root / "cache" / "vllm-0.25.1" / ".unpacked").write_text("w sha\n")
    (root / "cache" / "vllm-0.25.1" / "big.so").write_bytes(b"x" * 3 * 2**20)
    (root / "trees" / "tests").mkdir(parents=True)
    (root / "trees" / "tests" / ".gate-trees").write_text("")
    (root / "trees" / "mine").mkdir()  # no marker: not the gate's
    (root / "trees" / "mine" / "notes.txt").write_text("keep")
    (root / "refs" / "abc-def").mkdir(parents=True)
    return root


def test_the_listing_names_each_entry_its_size_and_what_it_is(tmp_path):
    text = clean.listing(clean.entries(_gate(tmp_path)))
    assert "cache/vllm-0.25.1" in text and "3 MiB  an unpacked vLLM release" in text
    assert "trees/mine" in text and "(not made by the gate: kept)" in text
    assert text.splitlines()[-1].startswith("total")


def test_only_named_entries_the_gate_made_are_removed(tmp_path):
    root = _gate(tmp_path)
    gone = clean.remove(["trees/tests", "refs/abc-def/"], everything=False, root=root)
    assert [e.name for e in gone] == ["trees/tests", "refs/abc-def"]
    assert not (root / "trees" / "tests").exists() and (root / "cache" / "vllm-0.25.1").exists()
    with pytest.raises(UsageError, match="not made by the gate"):
        clean.remove(["trees/mine"], everything=False, root=root)
    with pytest.raises(UsageError, match="trees/nope: not in"):
        clean.remove(["trees/nope"], everything=False, root=root)
    clean.remove([], everything=True, root=root)
    assert [e.name for e in clean.entries(root)] == ["trees/mine"]
    assert (root / "trees" / "mine" / "notes.txt").read_text() == "keep"

"""ci.trees.release_deps: the CPU tier's dependencies from a release's Requires-Dist (the rule in its docstring)."""

from __future__ import annotations

import pytest

from ci.trees import release_deps

# Lines as vLLM 0.33.0's METADATA has them (a sample of each kind).
METADATA = """Metadata-Version: 2.4
Name: vllm
Version: 0.33.0
Requires-Dist: regex
Requires-Dist: transformers<5.21.0,>=5.16.1
Requires-Dist: protobuf==7.36.1; platform_machine == "s390x"
Requires-Dist: six>=1.16.0; python_version > "3.0"
Requires-Dist: mistral_common[image]>=1.11.6
Requires-Dist: torch==2.14.0
Requires-Dist: torchaudio==2.11.0
Requires-Dist: torchvision==0.29.0
Requires-Dist: flashinfer-python==0.7.2.post1
Requires-Dist: nvidia-cutlass-dsl[cu13]==4.8.0
Requires-Dist: Opencv_Python.Headless>=4.13.0
Requires-Dist: pandas; extra == "bench"

A long description that is not a header.
"""


def test_the_rule_keeps_what_imports_need_and_drops_gpu_extras_and_false_markers():
    lines, dropped = release_deps.cpu_tier_requirements(METADATA)
    assert lines == [
        "torch==2.14.*",
        "regex",
        "transformers<5.21.0,>=5.16.1",
        "six>=1.16.0",
        "mistral_common[image]>=1.11.6",
    ]
    why = dict(dropped)
    assert why['protobuf==7.36.1; platform_machine == "s390x"'] == "its marker is false here"
    assert why['pandas; extra == "bench"'] == "an extra"
    assert why["torchaudio==2.11.0"] == why["torchvision==0.29.0"] == "torch family, GPU/media only"
    assert why["flashinfer-python==0.7.2.post1"] == why["nvidia-cutlass-dsl[cu13]==4.8.0"] == "GPU-only or heavy"
    assert why["Opencv_Python.Headless>=4.13.0"] == "GPU-only or heavy"  # names compared canonically
    assert len(dropped) == 7


@pytest.mark.parametrize(
    ("line", "want"),
    [
        ("torch==2.14.0", "torch==2.14.*"),
        ("torch==2.11.0", "torch==2.11.*"),
        ("torch>=2.9", "torch>=2.9"),
        ("torch==2.14.0rc1", "torch==2.14.0rc1"),
    ],
)
def test_torch_is_held_to_the_release_minor_series(line, want):
    from packaging.requirements import Requirement

    assert release_deps.torch_line(Requirement(line)) == want


def test_metadata_without_torch_is_refused():
    with pytest.raises(ValueError, match="no torch requirement"):
        release_deps.cpu_tier_requirements("Name: x\nRequires-Dist: regex\n\n")


def test_the_requirements_file_records_what_was_dropped(tmp_path):
    (tmp_path / "vllm-0.33.0.dist-info").mkdir()
    (tmp_path / "vllm-0.33.0.dist-info" / "METADATA").write_text(METADATA)
    out = release_deps.write_requirements(
        release_deps.metadata_of(tmp_path), tmp_path / "d" / "r.txt", version="0.33.0"
    )
    text = out.read_text().splitlines()
    assert text[0].startswith("# The CPU tier's dependencies for vLLM 0.33.0")
    assert "# dropped: torchaudio==2.11.0  (torch family, GPU/media only)" in text
    assert next(t for t in text if not t.startswith("#")) == "torch==2.14.*"
    with pytest.raises(FileNotFoundError, match="not an unpacked vLLM wheel"):
        release_deps.metadata_of(tmp_path / "d")

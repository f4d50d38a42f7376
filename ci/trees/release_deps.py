"""What the CPU tier installs for a vLLM release, read from the release's own metadata (its wheel's
``Requires-Dist``), not from a hand-written list.

The rule (short on purpose; the README repeats it):

1. a requirement behind an extra (``; extra == "bench"``) or whose marker is false for this interpreter
   and platform is dropped;
2. GPU-only and heavy packages are dropped: the torch family except torch itself (``torchvision``,
   ``torchaudio``, ``torchcodec``), ``nvidia-*``, and names of ``GPU_ONLY`` (kernel libraries, CUDA
   bindings, video codecs, Ray, OpenCV): the CPU tier never runs them, and vLLM's fused-MoE modules import
   none of them at module level;
3. torch is pinned to the release's minor series (``torch==2.14.0`` becomes ``torch==2.14.*``): the CPU
   tier runs torch's CPU ops only, so a patch release of the same minor is the same API, and it lets a
   host take the build it has (a CPU build from ``GATE_TORCH_INDEX_URL``, or a local wheel).

Standard library and ``packaging`` (which nox and pip bring) only: the noxfile calls it before the
session's environment has anything.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Sequence
from email.parser import Parser
from pathlib import Path

GPU_ONLY = frozenset(
    {
        "flashinfer-python",
        "flashinfer-cubin",
        "flashinfer-jit-cache",
        "apache-tvm-ffi",
        "tilelang",
        "quack-kernels",
        "tokenspeed-mla",
        "humming-kernels",
        "nvtx",
        "pynvvideocodec",
        "fastsafetensors",
        "instanttensor",
        "xformers",
        "triton",
        "cupy-cuda12x",
        "cupy-cuda13x",
        "deep-gemm",
        "deep-ep",
        "ray",
        "vllm-flash-attn",
        "cuda-python",
        "cuda-bindings",
        "opencv-python-headless",
        "opencv-python",
    }
)
TORCH_FAMILY = frozenset({"torchvision", "torchaudio", "torchcodec"})


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def requires_dist(metadata_text: str) -> list[str]:
    """The ``Requires-Dist`` lines of a METADATA file."""
    return Parser().parsestr(metadata_text).get_all("Requires-Dist") or []


def dropped_because(requirement) -> str | None:
    """Why the CPU tier does not install ``requirement`` (a packaging Requirement), or None."""
    name = canonical(requirement.name)
    if requirement.marker is not None:
        if "extra" in str(requirement.marker):
            return "an extra"
        if not requirement.marker.evaluate():
            return "its marker is false here"
    if name in TORCH_FAMILY:
        return "torch family, GPU/media only"
    if name.startswith("nvidia-") or name in GPU_ONLY:
        return "GPU-only or heavy"
    return None


def torch_line(requirement) -> str:
    """torch==X.Y.Z -> torch==X.Y.*; any other torch specifier is kept as it is."""
    pins = [s.version for s in requirement.specifier if s.operator == "=="]
    if len(pins) == 1 and re.fullmatch(r"\d+\.\d+\.\d+", pins[0]):
        major, minor, _ = pins[0].split(".")
        return f"torch=={major}.{minor}.*"
    return f"torch{requirement.specifier}"


def cpu_tier_requirements(metadata_text: str) -> tuple[list[str], list[tuple[str, str]]]:
    """(requirement lines, torch first; [(dropped requirement, why)]) for a release's METADATA."""
    from packaging.requirements import Requirement

    keep, dropped, torch = [], [], None
    for line in requires_dist(metadata_text):
        req = Requirement(line)
        if req.url is not None and dropped_because(req) is None:
            raise ValueError(
                f"the release requires {req.name} from {req.url!r}: the CPU tier installs only from "
                "the package index, by name and version; refusing a URL requirement"
            )
        why = dropped_because(req)
        if why:
            dropped.append((line, why))
        elif canonical(req.name) == "torch":
            torch = torch_line(req)
        else:
            req.marker = None  # evaluated above
            keep.append(str(req))
    if torch is None:
        raise ValueError("the release's metadata has no torch requirement: is this vLLM's METADATA?")
    return [torch, *keep], dropped


def metadata_of(release_root: Path) -> str:
    """The METADATA of the vLLM unpacked at ``release_root`` (what ``ci.trees.build`` caches)."""
    found = sorted(release_root.glob("vllm-*.dist-info/METADATA"))
    if not found:
        raise FileNotFoundError(f"{release_root}: no vllm-*.dist-info/METADATA (not an unpacked vLLM wheel)")
    return found[0].read_text()


def write_requirements(metadata_text: str, out: Path, *, version: str) -> Path:
    lines, dropped = cpu_tier_requirements(metadata_text)
    header = [
        f"# The CPU tier's dependencies for vLLM {version}, from its Requires-Dist (python -m ci.trees.release_deps).",
        *[f"# dropped: {line}  ({why})" for line, why in dropped],
    ]
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("\n".join([*header, *lines]) + "\n")
    return out


def main(argv: Sequence[str] | None = None) -> int:
    from ci.trees.build import GATE_DIR
    from ci.trees.release import fetch_release

    parser = argparse.ArgumentParser(
        allow_abbrev=False, prog="python -m ci.trees.release_deps", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--vllm", required=True, help="a vLLM release, e.g. 0.33.0")
    parser.add_argument("--out", type=Path, help="requirements file to write (default .gate/deps/vllm-X.txt)")
    parser.add_argument("--cache", type=Path, default=GATE_DIR / "cache")
    args = parser.parse_args(argv)
    release = fetch_release(args.vllm, args.cache)
    out = write_requirements(
        metadata_of(release.root), args.out or GATE_DIR / "deps" / f"vllm-{args.vllm}.txt", version=args.vllm
    )
    print(out)
    return 0


if __name__ == "__main__":
    from ci.core.cli import run_main

    sys.exit(run_main(main))

"""The options every nox session takes after ``--`` (stdlib only: the noxfile imports it).

``--vllm``, ``--vllm-src`` (with ``--base-ref``/``--head-ref``), ``--patch`` or ``--change``, ``--contract``
and ``--reverse`` choose the vLLM and the change under test;
``--out`` the output folder; everything else is passed through to the tool the session
runs (pytest, the benchmark, ...).
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from dataclasses import dataclass

from ci.build import DEFAULT_VLLM


@dataclass(frozen=True, kw_only=True)
class SessionArgs:
    vllm: str
    build_argv: tuple[str, ...]
    out: str | None
    rest: tuple[str, ...]

    @property
    def installed(self) -> bool:
        return self.vllm == "installed"


def parse_session_args(posargs: Sequence[str]) -> SessionArgs:
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--vllm", default=DEFAULT_VLLM)
    parser.add_argument("--vllm-src")
    parser.add_argument("--patch")
    parser.add_argument("--change")
    parser.add_argument("--contract")
    parser.add_argument("--reverse", action="store_true")
    parser.add_argument("--base-ref")
    parser.add_argument("--head-ref")
    parser.add_argument("--out")
    known, rest = parser.parse_known_args(list(posargs))
    build_argv = ["--vllm", known.vllm]
    if known.vllm_src:
        build_argv += ["--vllm-src", known.vllm_src]
    for flag, value in (("--patch", known.patch), ("--change", known.change), ("--contract", known.contract)):
        if value:
            build_argv += [flag, value]
    if known.reverse:
        build_argv.append("--reverse")
    for flag, value in (("--base-ref", known.base_ref), ("--head-ref", known.head_ref)):
        if value:
            build_argv += [flag, value]
    return SessionArgs(vllm=known.vllm, build_argv=tuple(build_argv), out=known.out, rest=tuple(rest))

"""The options every nox session takes after ``--`` (stdlib only: the noxfile imports it).

``--vllm``, ``--vllm-src`` (with ``--base-ref``/``--head-ref``), ``--patch`` or ``--change``, ``--contract``
and ``--reverse`` choose the vLLM and the change under test;
``--out`` the output folder; everything else is passed through to the tool the session
runs (pytest, the benchmark, ...).
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

from ci.core.errors import UsageError
from ci.trees.build import add_source_arguments


@dataclass(frozen=True, kw_only=True)
class SessionArgs:
    vllm: str
    build_argv: tuple[str, ...]
    out: str | None
    rest: tuple[str, ...]

    @property
    def installed(self) -> bool:
        return self.vllm == "installed"


def _source_options() -> tuple[str, ...]:
    parser = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    return (*(o for a in add_source_arguments(parser) for o in a.option_strings), "--out")


SOURCE_OPTIONS = _source_options()  # what every session takes itself (the rest goes to its tool)


def parse_session_args(posargs: Sequence[str]) -> SessionArgs:
    """The source options (``ci.trees.build.add_source_arguments``, the same definitions the stages use) and
    ``--out``; ``build_argv`` repeats the source options given, for ``python -m ci.trees.build``. No option is
    taken by an abbreviation of its name: ``--contrac`` stays in ``rest``, where the noxfile refuses it."""
    parser = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    source = add_source_arguments(parser)
    parser.add_argument("--out")
    known, rest = parser.parse_known_args(list(posargs))
    build_argv = ["--vllm", known.vllm]
    for action in source:
        value, flag = getattr(known, action.dest), action.option_strings[0]
        if flag == "--vllm" or value is None or value == action.default:
            continue
        build_argv += [flag] if value is True else [flag, str(value)]
    return SessionArgs(vllm=known.vllm, build_argv=tuple(build_argv), out=known.out, rest=tuple(rest))


RELEASE_RE = r"\d+\.\d+\.\d+(?:\.post\d+)?"  # a final release as the package index names it (0.34.0, 0.8.5.post1)


class ReleaseArgs(NamedTuple):
    releases: tuple[str, ...]
    rest: tuple[str, ...]
    discard_envs: bool  # remove each release's environment once its tier ran (a CI disk holds one at a time)


def parse_release_args(posargs: Sequence[str], *, default: Sequence[str]) -> ReleaseArgs:
    """``tests_release``'s options: ``--release`` takes one or more of ``newest`` (the package index's newest,
    read at run time) and X.Y.Z releases, and may be repeated; without it, ``default``. ``--discard-envs``
    removes each release's environment after its tier (each is several GB where torch is a CUDA build).
    Anything else is refused with the fix (exit 2), never taken for a release."""
    parser = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    parser.add_argument("--release", nargs="+", action="extend")
    parser.add_argument("--discard-envs", action="store_true")
    known, rest = parser.parse_known_args(list(posargs))
    releases = tuple(known.release or default)
    bad = [r for r in releases if r != "newest" and not re.fullmatch(RELEASE_RE, r)]
    if bad:
        raise UsageError(f"--release {' '.join(bad)}: expected 'newest' or a release such as 0.34.0")
    return ReleaseArgs(releases, tuple(rest), known.discard_envs)

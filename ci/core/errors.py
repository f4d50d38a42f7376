"""One user-error hierarchy with a distinct exit code per kind.

The CLIs catch :class:`GateError` and print its message (what happened, the likely
cause, what to run next) instead of a traceback. Any other exception is a bug of the gate:
it exits with ``INTERNAL`` (70, sysexits' EX_SOFTWARE), never with a verdict's code.
The codes are the gate's API (workflows branch on them): keep them stable.
"""

from __future__ import annotations

import enum


class ExitCode(enum.IntEnum):
    OK = 0
    FAILED = 1  # tests failed, or the gate's verdict is FAIL
    USAGE = 2  # bad arguments or options
    INCONCLUSIVE = 3  # the gate could not decide: re-run with more repeats
    NO_BASELINE = 4  # no stored baseline matches this run
    PATCH = 5  # the patch does not apply
    NO_GPU = 6  # a GPU is needed and none is usable
    DATA = 7  # a results or baseline file is missing, corrupt or of an unknown schema
    SERVER = 8  # a server the stage started, or its client, failed
    ENVIRONMENT = 9  # the software under test or a tool is missing
    INCOMPLETE = 10  # the evidence is incomplete (cases, rounds or samples missing, failed requests): re-run
    GPU_BUSY = 11  # a GPU is there but another workload is using it
    WRONG_RESULTS = 12  # the candidate computed wrong numbers (or crashed) in a case: a correctness failure
    UNTRUSTED = 13  # a trust check of the GPU workflows failed (a PR head that moved, a run from another ref)
    RELEASE_AHEAD = 14  # the package index has a newer release of the software under test than the gate follows
    INTERNAL = 70  # a bug in the gate itself (an unexpected exception): report it with the traceback


# pytest's own exit codes, as the gate's: tests failed 1 -> FAILED, interrupted 2 -> 130, internal error 3 ->
# INTERNAL, usage error 4 and no test collected 5 (a filter that matches nothing) -> USAGE. One table: the noxfile
# and the GPU verdict (ci.runner.gpu_gate) both pass pytest's code on through it.
PYTEST_CODES = {
    1: int(ExitCode.FAILED),
    2: 130,
    3: int(ExitCode.INTERNAL),
    4: int(ExitCode.USAGE),
    5: int(ExitCode.USAGE),
}


class GateError(Exception):
    """Base class: a problem the user can fix; the message says how."""

    exit_code: ExitCode = ExitCode.USAGE


class UsageError(GateError):
    exit_code = ExitCode.USAGE


class PatchError(GateError):
    exit_code = ExitCode.PATCH


class NoGPUError(GateError):
    exit_code = ExitCode.NO_GPU


class DataError(GateError):
    exit_code = ExitCode.DATA


class NoBaselineError(GateError):
    exit_code = ExitCode.NO_BASELINE


class ServerError(GateError):
    exit_code = ExitCode.SERVER


class MissingDependencyError(GateError):
    exit_code = ExitCode.ENVIRONMENT


class IncompleteEvidenceError(GateError):
    exit_code = ExitCode.INCOMPLETE


class GPUBusyError(GateError):
    exit_code = ExitCode.GPU_BUSY


class WrongResultsError(GateError):
    exit_code = ExitCode.WRONG_RESULTS


class UndeclaredChangeError(GateError):
    """The candidate changes a path its contract does not declare (its numbers may be right): a FAIL."""

    exit_code = ExitCode.FAILED


class UntrustedError(GateError):
    exit_code = ExitCode.UNTRUSTED


class ReleaseAheadError(GateError):
    exit_code = ExitCode.RELEASE_AHEAD

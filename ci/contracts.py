"""What a change under test promises: its contract (optional), loaded from a small Python file.

A change lives in ``ci/changes/<name>/``: ``change.patch`` and, optionally, ``contract.py`` beside it.
Every change, with a contract or without, is held to the universal invariants of the subject it touches
(for the Marlin MoE kernels: ``tests/ep_marlin/cpu_harness.py``) and to the numerics and performance
checks. A contract adds what only the change's author can say:

* which paths it is allowed to change (``CHANGES_NON_EP``, ``CHANGES_EP``, ``CHANGES_BATCHED``; a path it
  does not declare must hand the kernels exactly the base's arguments, under the default setting);
* exact rules (``fused_block_size_m``, ``batched_block_size_m``): the block size it must pick, per call;
* ``SETTINGS``: named environment settings the rules are checked under (``{"default": {}}`` when absent),
  e.g. an opt-in variable whose default must leave everything as it was.

Without a contract only the universal invariants are assumed: the non-EP path must stay identical (the
issue of #48144: callers without expert parallelism see no change), every other path may change, no exact
rule is checked, and every report says so (``NO_CONTRACT``).

A contract file is Python from this repository's ``ci/changes/`` (or a path given with ``--contract``):
it is run in the test process, like the tests are.
"""

from __future__ import annotations

import hashlib
import importlib.util
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from ci.errors import UsageError

CONTRACT_FILE = "contract.py"
DEFAULT_SETTING = "default"
NO_CONTRACT = "no contract: no rule of the change was checked (universal invariants, numerics and performance only)"
_FLAGS = ("CHANGES_NON_EP", "CHANGES_EP", "CHANGES_BATCHED")
_RULES = ("fused_block_size_m", "batched_block_size_m")


@dataclass(frozen=True)
class Contract:
    name: str
    path: str
    sha256: str
    summary: str
    upstream: str
    changes_non_ep: bool
    changes_ep: bool
    changes_batched: bool
    settings: dict[str, dict[str, str]] = field(default_factory=lambda: {DEFAULT_SETTING: {}})
    fused_block_size_m: Callable[..., int] | None = None
    batched_block_size_m: Callable[..., int] | None = None

    @property
    def rules(self) -> list[str]:
        return [r for r in _RULES if getattr(self, r) is not None]

    def describe(self) -> str:
        """One line for reports: the contract, the rules it adds and the paths it may change."""
        paths = [p for p, on in (("non-EP fused", self.changes_non_ep), ("EP fused", self.changes_ep),
                                 ("batched", self.changes_batched)) if on]  # fmt: skip
        return (
            f"contract {self.name} ({self.upstream}): rules {', '.join(self.rules) or 'none'}; may change "
            f"{', '.join(paths) or 'nothing by default'}; settings {', '.join(self.settings)}"
        )

    def to_json(self) -> dict:
        return {"name": self.name, "path": self.path, "sha256": self.sha256, "rules": self.rules,
                "describe": self.describe()}  # fmt: skip


PATHS = ("non_ep", "ep", "batched")  # the non-EP fused path, the EP fused path, the batched path


def may_change(contract: Contract | None, path: str) -> bool:
    """Whether the change may change ``path``'s kernel arguments (without a contract: all but non-EP)."""
    if path not in PATHS:
        raise ValueError(f"unknown path {path!r}; one of {PATHS}")
    if contract is None:
        return path != "non_ep"
    return getattr(contract, f"changes_{path}")


def beside(patch: Path) -> Path | None:
    """The contract that sits next to ``patch`` (``ci/changes/<name>/contract.py``), if any."""
    candidate = patch.parent / CONTRACT_FILE
    return candidate if candidate.is_file() else None


def load_contract(path: Path) -> Contract:
    """Run a contract file and check what it defines; every mistake is one error naming file and fix."""
    if not path.is_file():
        raise UsageError(f"--contract {path}: no such file; give a contract.py, or 'none' to test without one")
    spec = importlib.util.spec_from_file_location(f"gate_contract_{path.parent.name.replace('-', '_')}", path)
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except Exception as exc:  # a broken contract is the user's input: say where
        raise UsageError(f"{path}: the contract failed to load: {type(exc).__name__}: {exc}") from exc
    missing = [n for n in ("NAME", "UPSTREAM", "SUMMARY", *_FLAGS) if not hasattr(module, n)]
    if missing:
        raise UsageError(f"{path}: the contract does not define {', '.join(missing)} (see ci/contracts.py)")
    flags = {n: getattr(module, n) for n in _FLAGS}
    not_bool = [n for n, v in flags.items() if not isinstance(v, bool)]
    if not_bool:
        raise UsageError(f"{path}: {', '.join(not_bool)} must be True or False")
    settings = getattr(module, "SETTINGS", {DEFAULT_SETTING: {}})
    if (
        not isinstance(settings, dict)
        or DEFAULT_SETTING not in settings
        or not all(
            isinstance(v, dict) and all(isinstance(k, str) and isinstance(x, str) for k, x in v.items())
            for v in settings.values()
        )
    ):
        raise UsageError(
            f"{path}: SETTINGS must map names to {{variable: value}} strings, with a {DEFAULT_SETTING!r} one"
        )
    if settings[DEFAULT_SETTING]:
        raise UsageError(f"{path}: SETTINGS[{DEFAULT_SETTING!r}] must be empty: it is what a user gets by default")
    rules = {r: getattr(module, r, None) for r in _RULES}
    bad = [r for r, f in rules.items() if f is not None and not callable(f)]
    if bad:
        raise UsageError(f"{path}: {', '.join(bad)} must be a function")
    return Contract(
        name=str(module.NAME),
        path=str(path),
        sha256=hashlib.sha256(path.read_bytes()).hexdigest(),
        summary=str(module.SUMMARY),
        upstream=str(module.UPSTREAM),
        changes_non_ep=flags["CHANGES_NON_EP"],
        changes_ep=flags["CHANGES_EP"],
        changes_batched=flags["CHANGES_BATCHED"],
        settings=settings,
        **rules,
    )


REPO_ROOT = Path(__file__).resolve().parent.parent


def from_manifest(record: dict | None, manifest_path: Path | str = "the manifest") -> Contract | None:
    """The contract a tree manifest recorded (None: the change has none), checked unchanged since the build."""
    if record is None:
        return None
    path = Path(record["path"])
    if not path.is_absolute() and not path.is_file():
        path = REPO_ROOT / path
    contract = load_contract(path)
    if contract.sha256 != record["sha256"]:
        raise UsageError(
            f"{path}: the contract changed since {manifest_path} was built (sha256 {record['sha256'][:12]} -> "
            f"{contract.sha256[:12]}); rebuild the trees (nox -s build, or rerun the session)"
        )
    return contract

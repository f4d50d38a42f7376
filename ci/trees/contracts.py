"""What a change under test promises: its contract (optional), loaded from a small Python file.

A change lives in ``ci/changes/<name>/``: ``change.patch`` and, optionally, ``contract.py`` beside it.
Every change, with a contract or without, is held to the universal invariants of the subject it touches
(for the Marlin MoE kernels: ``tests/ep_marlin/cpu_harness.py``) and to the numerics and performance
checks. A contract adds what only the change's author can say:

* which paths it is allowed to change (``CHANGES_NON_EP``, ``CHANGES_EP``, ``CHANGES_BATCHED``; a path it
  does not declare must hand the kernels exactly the base's arguments, under the default setting);
* exact rules (``fused_block_size_m``, ``batched_block_size_m``): the block size it must pick, per call;
* ``ENTRY_MODULE``: the module the candidate is loaded through, its subject's entry (default: Marlin's
  ``marlin_moe``; a Triton fused-MoE change names ``fused_moe.fused_moe``, and its rule ``triton_config``
  gives the config under EP from the spec's configs for ``M`` and for ``ceil(M * E / G)`` rows; ``None``:
  chosen as without a contract, the subject entry that reaches every changed module);
* ``SETTINGS``: named environment settings the rules are checked under (``{"default": {}}`` when absent),
  e.g. an opt-in variable whose default must leave everything as it was.

Without a contract only the universal invariants are assumed: the non-EP path must stay identical (the
issue of #48144: callers without expert parallelism see no change), every other path may change, no exact
rule is checked, and every report says so (``NO_CONTRACT``).

A contract is data with a few pure functions, not a program: it is read as Python, but only a small part
of the language is accepted (:func:`check_source`: names bound to values, ``from ci.moe import spec`` and
``import math``, and functions of arithmetic, comparisons, ``spec``'s rules and the environment mapping they
are given), and it runs with a short list of builtins, so it cannot reach the gate's own code, the file
system or the process. Anything it raises while loading, ``SystemExit`` included, is a usage error naming
the file (:class:`ContractError`, exit 2), never the gate's exit code.
"""

from __future__ import annotations

import ast
import builtins
import hashlib
import math
import traceback
import types
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from ci.core.errors import UsageError
from ci.moe import spec
from ci.trees.variants import ENTRY_MODULE, ENTRY_MODULES

CONTRACT_FILE = "contract.py"
DEFAULT_SETTING = "default"
NO_CONTRACT = "no contract: no rule of the change was checked (universal invariants, numerics and performance only)"
_FLAGS = ("CHANGES_NON_EP", "CHANGES_EP", "CHANGES_BATCHED")
_RULES = ("fused_block_size_m", "batched_block_size_m", "triton_config")


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
    triton_config: Callable[..., dict] | None = None  # the Triton fused-MoE config under EP (ci.triton_moe)
    entry_module: str | None = ENTRY_MODULE  # the module the candidate is loaded through: the subject's entry
    # (None: the build chooses it as without a contract, ci.trees.variants.choose_entry)

    @property
    def rules(self) -> list[str]:
        return [r for r in _RULES if getattr(self, r) is not None]

    def describe(self) -> str:
        """One line for reports: the contract, the rules it adds and the paths it may change."""
        paths = [
            p
            for p, on in (
                ("non-EP fused", self.changes_non_ep),
                ("EP fused", self.changes_ep),
                ("batched", self.changes_batched),
            )
            if on
        ]
        return (
            f"contract {self.name} ({self.upstream}): rules {', '.join(self.rules) or 'none'}; may change "
            f"{', '.join(paths) or 'nothing by default'}; settings {', '.join(self.settings)}"
        )

    def to_json(self) -> dict:
        return {
            "name": self.name,
            "path": self.path,
            "sha256": self.sha256,
            "rules": self.rules,
            "describe": self.describe(),
            "entry_module": self.entry_module,
        }


class ContractError(UsageError):
    """A contract file that is not one: it says which file, which line and what to do."""


# What a contract may use: modules by the name it imports them under, builtins, methods of the values it gets.
MODULES = {"spec": spec, "math": math}
BUILTINS = (
    "abs",
    "all",
    "any",
    "bool",
    "dict",
    "divmod",
    "enumerate",
    "float",
    "int",
    "isinstance",
    "len",
    "list",
    "max",
    "min",
    "range",
    "round",
    "set",
    "sorted",
    "str",
    "sum",
    "tuple",
    "zip",
    "ValueError",
    "TypeError",
    "KeyError",
    "RuntimeError",
    "ArithmeticError",
    "ZeroDivisionError",
    "AssertionError",
)
METHODS = frozenset(
    {
        "get",
        "items",
        "keys",
        "values",
        "startswith",
        "endswith",
        "lower",
        "upper",
        "strip",
        "split",
        "isdigit",
        "count",
        "index",
    }
)
TOP_LEVEL = (ast.Assign, ast.AnnAssign, ast.FunctionDef, ast.Import, ast.ImportFrom)
# Every kind of syntax a contract may hold (an allow-list: anything else, a ``match`` statement, a class, a
# ``while``, ``try``, ``with``, ``global``, ``lambda`` defaults aside, is refused with its line)
ALLOWED = (
    ast.Module,
    ast.Expr,
    ast.Constant,
    *TOP_LEVEL,
    ast.alias,
    ast.arguments,
    ast.arg,
    ast.keyword,
    ast.Return,
    ast.If,
    ast.IfExp,
    ast.For,
    ast.comprehension,
    ast.ListComp,
    ast.SetComp,
    ast.DictComp,
    ast.GeneratorExp,
    ast.BinOp,
    ast.UnaryOp,
    ast.BoolOp,
    ast.Compare,
    ast.Call,
    ast.Name,
    ast.Attribute,
    ast.Subscript,
    ast.Slice,
    ast.Tuple,
    ast.List,
    ast.Dict,
    ast.Set,
    ast.Load,
    ast.Store,
    ast.operator,
    ast.unaryop,
    ast.boolop,
    ast.cmpop,
    ast.Lambda,
    ast.Raise,
    ast.Assert,
    ast.Pass,
    ast.Break,
    ast.Continue,
    ast.AugAssign,
    ast.JoinedStr,
    ast.FormattedValue,
)
MAX_SOURCE_BYTES = 64 * 1024  # a contract is a page of rules; a larger file is refused before it is parsed
# the fields that hold a name a contract's code binds or reads: none of them may be a dunder name
IDENTIFIER_FIELDS = {ast.Name: "id", ast.arg: "arg", ast.keyword: "arg", ast.FunctionDef: "name", ast.alias: "asname"}


def _refuse(path: Path, node: ast.AST, what: str) -> ContractError:
    return ContractError(
        f"{path}, line {getattr(node, 'lineno', '?')}: {what}. A contract holds only NAME = value lines, "
        "`from ci.moe import spec`, `import math` and rule functions of spec's rules and the env mapping they get "
        "(ci/trees/contracts.py)"
    )


def check_source(text: str, path: Path) -> ast.Module:
    """The parsed contract, or a :class:`ContractError` naming the first construct it may not use: every node
    must be of a kind in ``ALLOWED``, and no name it binds or reads may be a dunder name."""
    if len(text.encode()) > MAX_SOURCE_BYTES:
        raise ContractError(
            f"{path}: {len(text.encode()):,} bytes; a contract is at most {MAX_SOURCE_BYTES:,} "
            "(NAME = value lines and a few rule functions)"
        )
    try:
        tree = ast.parse(text, str(path))
    except (SyntaxError, ValueError) as exc:
        raise ContractError(f"{path}: not valid Python ({exc})") from exc
    except (MemoryError, RecursionError):
        raise ContractError(f"{path}: nested too deeply for Python to parse; write the rule flatter") from None
    for i, node in enumerate(tree.body):
        docstring = i == 0 and isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)
        if not (docstring or isinstance(node, TOP_LEVEL)):
            raise _refuse(path, node, f"a {type(node).__name__} statement at the top level")
        if isinstance(node, ast.Import) and [(a.name, a.asname) for a in node.names] != [("math", None)]:
            raise _refuse(path, node, "an import other than `import math`")
        if isinstance(node, ast.ImportFrom) and (node.level, node.module, [(a.name, a.asname) for a in node.names]) != (
            0,
            "ci.moe",
            [("spec", None)],
        ):
            raise _refuse(path, node, "an import other than `from ci.moe import spec`")
        if isinstance(node, ast.FunctionDef) and node.decorator_list:
            raise _refuse(path, node, "a decorator")
    for node in ast.walk(tree):
        _check_node(node, tree, path)
    return tree


def _check_node(node: ast.AST, tree: ast.Module, path: Path) -> None:
    if not isinstance(node, ALLOWED):
        raise _refuse(path, node, f"a {type(node).__name__} construct")
    if isinstance(node, (ast.Import, ast.ImportFrom)) and node not in tree.body:
        raise _refuse(path, node, "an import inside a function")
    if isinstance(node, ast.FunctionDef) and getattr(node, "type_params", None):
        raise _refuse(path, node, "type parameters")
    field = IDENTIFIER_FIELDS.get(type(node))
    name = getattr(node, field) if field else None  # each of those node types has its field
    if isinstance(name, str) and name.startswith("__"):
        raise _refuse(path, node, f"the name {name}")
    if isinstance(node, ast.Attribute):
        _check_attribute(node, path)
    if isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Store) and not isinstance(node.value, ast.Name):
        raise _refuse(path, node, "an assignment into something other than a local name")


def _check_attribute(node: ast.Attribute, path: Path) -> None:
    """``spec.rule`` or ``math.ceil`` (read, not a module), or a read-only method of a value (``env.get``)."""
    if not isinstance(node.ctx, ast.Load):
        raise _refuse(path, node, f"an assignment to the attribute {node.attr}")
    if node.attr.startswith("_"):
        raise _refuse(path, node, f"the attribute {node.attr}")
    if isinstance(node.value, ast.Name) and node.value.id in MODULES:
        value = getattr(MODULES[node.value.id], node.attr, None)
        if value is None or isinstance(value, types.ModuleType):
            raise _refuse(path, node, f"{node.value.id}.{node.attr}, which is not one of its rules or constants")
    elif node.attr not in METHODS:
        raise _refuse(path, node, f"the attribute {node.attr} (only {', '.join(sorted(METHODS))} of a value)")


def _run(tree: ast.Module, path: Path) -> dict:
    """The contract's names after running it with the short list of builtins and, bound by name, the modules
    it imports (the import lines themselves do not run: no import machinery is reachable); any exception,
    ``SystemExit`` and ``KeyboardInterrupt`` too, is a :class:`ContractError` naming the line."""
    imports = [n for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom))]
    body = ast.Module(body=[n for n in tree.body if n not in imports], type_ignores=[])
    namespace = {"__builtins__": {name: getattr(builtins, name) for name in BUILTINS}}
    bound = {"math" if isinstance(n, ast.Import) else "spec" for n in imports}  # check_source allows these two
    namespace.update({name: MODULES[name] for name in bound})
    try:
        exec(compile(body, str(path), "exec"), namespace)  # checked by check_source, its builtins cut
    except BaseException as exc:  # a contract is the user's input: whatever it raises, say where
        frames = [f for f in traceback.extract_tb(exc.__traceback__) if f.filename == str(path)]
        where = f", line {frames[-1].lineno}" if frames else ""
        raise ContractError(f"{path}{where}: the contract failed to load: {type(exc).__name__}: {exc}") from None
    return namespace


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
    """Read a contract file and check what it defines; every mistake is one error naming file and fix."""
    if path.suffix != ".py":
        raise ContractError(f"--contract {path}: a contract is a .py file (ci/changes/<name>/contract.py)")
    if not path.is_file():
        raise ContractError(f"--contract {path}: no such file; give a contract.py, or 'none' to test without one")
    text = path.read_bytes()
    try:
        source = text.decode()
    except UnicodeDecodeError as exc:
        raise ContractError(f"{path}: not UTF-8 text ({exc})") from None
    module = types.SimpleNamespace(**_run(check_source(source, path), path))
    missing = [n for n in ("NAME", "UPSTREAM", "SUMMARY", *_FLAGS) if not hasattr(module, n)]
    if missing:
        raise ContractError(f"{path}: the contract does not define {', '.join(missing)} (see ci/trees/contracts.py)")
    flags = {n: getattr(module, n) for n in _FLAGS}
    not_bool = [n for n, v in flags.items() if not isinstance(v, bool)]
    if not_bool:
        raise ContractError(f"{path}: {', '.join(not_bool)} must be True or False")
    settings = getattr(module, "SETTINGS", {DEFAULT_SETTING: {}})
    if (
        not isinstance(settings, dict)
        or DEFAULT_SETTING not in settings
        or not all(
            isinstance(v, dict) and all(isinstance(k, str) and isinstance(x, str) for k, x in v.items())
            for v in settings.values()
        )
    ):
        raise ContractError(
            f"{path}: SETTINGS must map names to {{variable: value}} strings, with a {DEFAULT_SETTING!r} one"
        )
    if settings[DEFAULT_SETTING]:
        raise ContractError(f"{path}: SETTINGS[{DEFAULT_SETTING!r}] must be empty: it is what a user gets by default")
    entry = getattr(module, "ENTRY_MODULE", ENTRY_MODULE)
    if entry is not None and (not isinstance(entry, str) or entry not in ENTRY_MODULES):
        raise ContractError(
            f"{path}: ENTRY_MODULE must be the entry module of one of the gate's subjects "
            f"({', '.join(ENTRY_MODULES)}), or None for the one that reaches every changed module, found "
            f"{entry!r}: the gate has tests for those only"
        )
    rules = {r: getattr(module, r, None) for r in _RULES}
    bad = [r for r, f in rules.items() if f is not None and not callable(f)]
    if bad:
        raise ContractError(f"{path}: {', '.join(bad)} must be a function")
    return Contract(
        name=str(module.NAME),
        path=str(path),
        sha256=hashlib.sha256(text).hexdigest(),
        summary=str(module.SUMMARY),
        upstream=str(module.UPSTREAM),
        changes_non_ep=flags["CHANGES_NON_EP"],
        changes_ep=flags["CHANGES_EP"],
        changes_batched=flags["CHANGES_BATCHED"],
        settings=settings,
        entry_module=entry,
        **rules,
    )


REPO_ROOT = Path(__file__).resolve().parents[2]


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

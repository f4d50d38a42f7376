"""Import vLLM's base and candidate code side by side in one process.

The base tree is imported the normal way (it is first on ``sys.path``), from its sources: a path hook compiles
its modules and keeps their bytecode beside the trees, never in them. The candidate
differs from it only in the files that differ between the two trees (``ci.trees.treediff``: the
manifest records them, and they are checked again here against the trees themselves), and
both share the same compiled kernels, so the candidate is loaded as fresh module objects:
every changed module and the entry module (``marlin_moe``) are executed from the candidate
tree while every other import resolves to the already-imported base. Base and candidate
then run interleaved on one GPU in one process, which is what fair A/B timing needs.

Refused, at build and here, with the file named (:func:`candidate_modules`): a changed
non-Python file (bytecode and ``__pycache__`` included: the candidate is imported from source only), a changed
package ``__init__.py``, a removed module, and a changed module that neither the entry module nor another
changed module imports when it runs, since the candidate would never run it (it is not imported at all, only
inside ``if TYPE_CHECKING:`` blocks, or only through unchanged modules, which keep the base's). Changed lines
the tiers never execute are found by measuring them (``ci.trees.changed_lines``). What stays out of reach:
an unchanged module that imports a changed one keeps the base's version of it, so a change is tested where
the entry module and the changed modules use it.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import marshal
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

from ci.core.errors import DataError, MissingDependencyError, PatchError, UsageError
from ci.trees.manifest import Trees
from ci.trees.treediff import REMOVED, FileChange, code_unchanged, differences

ENTRY_MODULE = "vllm.model_executor.layers.fused_moe.experts.marlin_moe"
# the entry modules of the gate's subjects (Marlin's first): a change is loaded through the one its contract
# names, or, without one, the first through which the candidate runs every module it changes
ENTRY_MODULES = (ENTRY_MODULE, "vllm.model_executor.layers.fused_moe.fused_moe")
# the tests of each subject, by its entry module: its CPU tier and GPU suite (the noxfile, the verdict line)
SUBJECT_TESTS = {ENTRY_MODULE: "tests/ep_marlin", ENTRY_MODULES[1]: "tests/triton_moe"}


def module_name(rel_path: str) -> str:
    """``vllm/a/b.py`` -> ``vllm.a.b``."""
    return ".".join(Path(rel_path).with_suffix("").parts)


@functools.lru_cache(maxsize=50_000)
def _module_file(tree: Path, name: str) -> Path | None:
    path = tree.joinpath(*name.split("."))
    for candidate in (path / "__init__.py", path.with_suffix(".py")):
        if candidate.is_file():
            return candidate
    return None


def _is_type_checking(test) -> bool:
    import ast

    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def forget_files() -> None:
    """Drop what was read of trees' files (the import graph's caches): a later search reads them anew."""
    _module_file.cache_clear()
    _imports_of.cache_clear()


def _child_statements(node):
    """The statements directly inside ``node`` (bodies, else and finally blocks, handlers, match cases): imports
    are statements, so only statements need visiting, never the expressions that make up most of a file."""
    for field in ("body", "orelse", "finalbody"):
        yield from (c for c in getattr(node, field, None) or () if not isinstance(c, list))
    for inner in (*(getattr(node, "handlers", None) or ()), *(getattr(node, "cases", None) or ())):
        yield from inner.body


def _import_nodes(parsed):
    """(import node, whether it runs) for every import of ``parsed``: the bodies of ``if TYPE_CHECKING:`` blocks
    (``typing.TYPE_CHECKING`` too) run for type checkers only."""
    import ast

    stack = [(parsed, True)]
    while stack:
        node, runs = stack.pop()
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node, runs
            continue
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            stack.extend((child, False) for child in node.body)
            stack.extend((child, runs) for child in node.orelse)
            continue
        stack.extend((child, runs) for child in _child_statements(node))


def direct_imports(tree: Path, name: str, *, type_checking: bool = False) -> set[str]:
    """The ``vllm`` modules that module ``name`` of ``tree`` imports when it runs (also inside functions and
    ``try`` blocks; not in ``if TYPE_CHECKING:`` blocks, which never run, unless ``type_checking``), as its
    ``import`` statements name them: static, so an import by string (``importlib.import_module``) is not seen,
    and the module then counts as not imported."""
    path = _module_file(tree, name)
    if path is None:
        return set()
    st = path.stat()
    runtime, typed = _imports_of(tree, name, path, st.st_mtime_ns, st.st_size)
    return set(runtime | typed) if type_checking else set(runtime)


@functools.lru_cache(maxsize=20_000)
def _imports_of(tree: Path, name: str, path: Path, mtime_ns: int, size: int) -> tuple[frozenset[str], frozenset[str]]:
    """(what runs, what only type checkers see) of one file as it is: its time and size key the cache, so a
    search over the import graph parses each file once."""
    import ast

    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: dict[bool, set[str]] = {True: set(), False: set()}
    try:
        parsed = ast.parse(path.read_bytes(), str(path))
    except (SyntaxError, ValueError, MemoryError, RecursionError):
        return frozenset(), frozenset()  # the import of the candidate fails then, and with it every test
    for node, runs in _import_nodes(parsed):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        else:
            parts = package.split(".")[: len(package.split(".")) - node.level + 1] if node.level else []
            base = ".".join([*parts, *([node.module] if node.module else [])])
            targets = [base, *(f"{base}.{a.name}" for a in node.names)]
        for target in targets:
            pieces = target.split(".")
            if pieces[0] == "vllm":
                found[runs].update(".".join(pieces[:i]) for i in range(1, len(pieces) + 1))

    def known(names: set[str]) -> frozenset[str]:
        return frozenset(m for m in names if _module_file(tree, m) is not None)

    return known(found[True]), known(found[False] - found[True])


def _import_chain(
    tree: Path, start: str, goal: str, limit: int = 5000, *, type_checking: bool = False
) -> list[str] | None:
    """The shortest chain of imports from ``start`` to ``goal`` in ``tree`` (None: ``goal`` is not reached)."""
    parent: dict[str, str | None] = {start: None}
    queue = [start]
    while queue and len(parent) < limit:
        current = queue.pop(0)
        for nxt in sorted(direct_imports(tree, current, type_checking=type_checking)):
            if nxt not in parent:
                parent[nxt] = current
                if nxt == goal:
                    chain = [nxt]
                    while parent[chain[-1]] is not None:
                        chain.append(parent[chain[-1]])
                    return chain[::-1]
                queue.append(nxt)
    return None


def _why_not_run(tree: Path, entry: str, name: str) -> str:
    """Why the candidate never runs the changed module ``name`` when loaded through ``entry``."""
    chain = _import_chain(tree, entry, name)
    if chain is not None:
        return "is imported only through unchanged modules (" + " -> ".join(chain) + "), which keep the base's"
    typed = _import_chain(tree, entry, name, type_checking=True)
    if typed is not None:
        return "is imported only inside `if TYPE_CHECKING:` blocks (" + " -> ".join(typed) + "), which never run"
    return "is not imported by " + entry


def _not_testable(change: FileChange) -> str | None:
    """Why the in-process tiers cannot test this changed file (None: they can, it is a module they load)."""
    path = change.path
    if "__pycache__" in path.split("/") or path.endswith((".pyc", ".pyo")):
        return (
            f"{path} is bytecode: the gate tests the sources it can read and imports them from source only; "
            "remove the file from the patch"
        )
    if not path.endswith(".py"):
        return (
            f"{path} is not a Python module ({Path(path).suffix or 'no suffix'}): base and candidate share one "
            "process, which cannot hold two versions of it"
        )
    if path.endswith("/__init__.py"):
        return f"{path} is a package file: loading it twice in one process is unsafe"
    if change.what == REMOVED:
        return f"{path} is removed: the candidate would still import the base's copy"
    return None


def candidate_modules(
    changes: list[FileChange] | tuple[FileChange, ...],
    candidate: Path,
    *,
    source: str,
    entry: str = ENTRY_MODULE,
    explain: bool = True,
    base: Path | None = None,
) -> list[str]:
    """The modules to load from the candidate tree (every changed module, then the entry module), or one
    :class:`PatchError` naming each changed file the in-process tiers could not test, and why. With ``base``, a
    module whose code is the same in both trees (comments, docstrings or layout only:
    ``ci.trees.treediff.same_code``) changes nothing the candidate runs, so it is neither loaded nor refused."""
    problems, names = [], []
    for change in changes:
        if base is not None and code_unchanged(base, candidate, change):
            continue
        why = _not_testable(change)
        if why:
            problems.append(why)
        else:
            names.append(module_name(change.path))
    loaded = set(names) | {entry}
    bound, queue = {entry}, [entry]  # what the candidate's modules import of each other, from the entry on
    while queue:
        for nxt in direct_imports(candidate, queue.pop()) & loaded - bound:
            bound.add(nxt)
            queue.append(nxt)
    for name in sorted(set(names) - bound):
        how = _why_not_run(candidate, entry, name) if explain else f"is not reached from {entry}"
        problems.append(f"{name.replace('.', '/')}.py {how}, so the candidate would never run it")
    if problems:
        raise PatchError(
            f"{source} changes what the gate's in-process tiers cannot test: " + "; ".join(problems) + ". "
            f"Test only modules {entry} imports in this gate (split the patch; a change of another subject's "
            "path names its entry module in its contract, ENTRY_MODULE), or test the whole build with --vllm "
            "installed. Nothing was changed."
        )
    return [*names, *([] if entry in names else [entry])]


class SourceOnlyLoader(importlib.machinery.SourceFileLoader):
    """Compiles its module from the source file at every import: reads no bytecode and writes none, so a
    ``__pycache__`` beside the file (a patch may bring one) is never what runs."""

    def get_code(self, fullname):
        path = self.get_filename(fullname)
        return self.source_to_code(self.get_data(path), path)


class CachedSourceLoader(importlib.machinery.SourceFileLoader):
    """Like :class:`SourceOnlyLoader`, with the bytecode kept in a folder of the gate's outside the trees
    (``BYTECODE_DIR`` beside them), keyed by the source's path and checked against its sha256 at every import:
    the base tree's vLLM is compiled once, and nothing is read from or written into a tree."""

    cache: Path  # set by cached_loader_for

    def get_code(self, fullname):
        path = self.get_filename(fullname)
        source = self.get_data(path)
        header = importlib.util.MAGIC_NUMBER + hashlib.sha256(source).digest()
        cached = self.cache / (hashlib.sha256(os.path.abspath(path).encode()).hexdigest()[:40] + ".pyc")
        with contextlib.suppress(OSError, ValueError, EOFError, TypeError):
            data = cached.read_bytes()
            if data.startswith(header):
                return marshal.loads(data[len(header) :])
        code = self.source_to_code(source, path)
        if sys.dont_write_bytecode:  # python -B, PYTHONDONTWRITEBYTECODE
            return code
        with contextlib.suppress(OSError):
            cached.parent.mkdir(parents=True, exist_ok=True)
            tmp = cached.with_name(f".{cached.name}.{os.getpid()}")
            tmp.write_bytes(header + marshal.dumps(code))
            os.replace(tmp, cached)
        return code


BYTECODE_DIR = "bytecode"  # in the trees' folder, beside base/ and candidate/ (never inside a tree)


def cached_loader_for(cache: Path) -> type[CachedSourceLoader]:
    return type("CachedSourceLoader", (CachedSourceLoader,), {"cache": cache})


def _tree_path_hook(tree: Path, loader: type[importlib.machinery.SourceFileLoader]):
    """A path hook that imports the folders of ``tree`` with ``loader`` (Python sources) and the release's
    compiled extensions, and nothing else: no bytecode-only module (``x.pyc`` with no ``x.py``), no cache."""
    root = os.path.realpath(tree)
    details = (
        (loader, importlib.machinery.SOURCE_SUFFIXES),
        (importlib.machinery.ExtensionFileLoader, importlib.machinery.EXTENSION_SUFFIXES),
    )

    def hook(path: str):
        real = os.path.realpath(path or os.getcwd())
        if real != root and not real.startswith(root + os.sep):
            raise ImportError("not a folder of the gate's trees")
        return importlib.machinery.FileFinder(path, *details)

    hook.gate_tree = root  # type: ignore[attr-defined]
    return hook


def import_tree_from_source(tree: Path, cache: Path) -> None:
    """From now on, modules of ``tree`` are compiled from their sources, their bytecode cached in ``cache``."""
    root = os.path.realpath(tree)
    if any(getattr(h, "gate_tree", None) == root for h in sys.path_hooks):
        return
    sys.path_hooks.insert(0, _tree_path_hook(tree, cached_loader_for(cache)))
    for path in list(sys.path_importer_cache):
        real = os.path.realpath(path or os.getcwd())
        if real == root or real.startswith(root + os.sep):
            del sys.path_importer_cache[path]


class _TreeFinder(importlib.abc.MetaPathFinder):
    """Serves the named modules from ``tree``, from source only; everything else falls through to the normal path."""

    def __init__(self, tree: Path, names: frozenset[str]) -> None:
        self.tree, self.names = tree, names

    def find_spec(self, fullname, path=None, target=None):
        if fullname not in self.names:
            return None
        file = str(self.tree / (fullname.replace(".", "/") + ".py"))
        return importlib.util.spec_from_file_location(fullname, file, loader=SourceOnlyLoader(fullname, file))


def _parent_and_leaf(name: str) -> tuple[ModuleType, str]:
    parent_name, _, leaf = name.rpartition(".")
    return importlib.import_module(parent_name), leaf


def load_modules(tree: Path, names: list[str], during=None) -> dict[str, ModuleType]:
    """Execute ``names`` from ``tree`` as new module objects; leave ``sys.modules`` as it was. ``during``: a
    context manager the import runs inside (e.g. a module that registers a torch op when imported)."""
    wanted = frozenset(names)
    parents = {n: _parent_and_leaf(n) for n in names}  # imports the parents (and what they import) first
    saved_modules = {n: sys.modules.get(n) for n in names}
    saved_attrs = {n: getattr(p, leaf, None) for n, (p, leaf) in parents.items()}
    for n in names:
        sys.modules.pop(n, None)
    finder = _TreeFinder(tree, wanted)
    sys.meta_path.insert(0, finder)
    try:
        with during if during is not None else contextlib.nullcontext():
            loaded = {n: importlib.import_module(n) for n in names}
    finally:
        sys.meta_path.remove(finder)
        for n in names:
            if saved_modules[n] is None:
                sys.modules.pop(n, None)
            else:
                sys.modules[n] = saved_modules[n]
            parent, leaf = parents[n]
            if saved_attrs[n] is None:
                if hasattr(parent, leaf):
                    delattr(parent, leaf)
            else:
                setattr(parent, leaf, saved_attrs[n])
    for n, mod in loaded.items():
        if not Path(mod.__file__).resolve().is_relative_to(tree.resolve()):
            raise DataError(f"{n} was loaded from {mod.__file__}, not from the tree {tree}")
    return loaded


@dataclass(frozen=True)
class Variant:
    """One side of the A/B: ``marlin_moe`` is that side's module object."""

    name: str
    marlin_moe: ModuleType

    @property
    def fused_marlin_moe(self):
        return self.marlin_moe.fused_marlin_moe


# import name -> the package that provides it, where they differ (for the message below)
PACKAGE_OF = {
    "cpuinfo": "py-cpuinfo",
    "yaml": "pyyaml",
    "zmq": "pyzmq",
    "PIL": "pillow",
    "cv2": "opencv-python-headless",
    "google": "protobuf",
    "sklearn": "scikit-learn",
    "jwt": "pyjwt",
    "dateutil": "python-dateutil",
}


def missing_module_message(module: str, version: str, tree: Path) -> str:
    """One clear line for a dependency the vLLM under test imports and this environment lacks."""
    top = module.split(".")[0]
    package = PACKAGE_OF.get(top, top.replace("_", "-"))
    return (
        f"vLLM {version} (the trees in {tree.parent}) imports {module!r}, which this environment does not have "
        f"(package {package!r}): the environment was made for another vLLM release. Run the CPU tier in an "
        f"environment made from vLLM {version}'s own Requires-Dist: nox -s tests_release -- --release {version} "
        "(any release; FOLLOWED_RELEASES in noxfile.py are those CI runs), or `pip install "
        f"{package}` here for this one module"
    )


def entry_module(trees: Trees) -> str:
    """The module the change's candidate is loaded through, as the build chose it (``choose_entry``)."""
    return trees.manifest.entry_module or (trees.manifest.contract or {}).get("entry_module") or ENTRY_MODULE


def choose_entry(
    changes, candidate: Path, *, source: str, declared: str | None = None, base: Path | None = None
) -> str:
    """The entry module of a change: the one its contract declares (which must then reach every changed
    module), else the first of ``ENTRY_MODULES`` that does; else Marlin's refusal, naming each file."""
    forget_files()  # the tree on disk now, not as an earlier call in this process saw it
    if declared and declared not in ENTRY_MODULES:
        raise UsageError(f"entry module {declared!r} is not one of the gate's subjects ({', '.join(ENTRY_MODULES)})")
    if declared:
        candidate_modules(changes, candidate, source=source, entry=declared, base=base)
        return declared
    for entry in ENTRY_MODULES[1:]:  # probes: their refusals are not shown, so not explained (a search each)
        try:
            candidate_modules(changes, candidate, source=source, entry=entry, explain=False, base=base)
        except PatchError:
            continue
        try:
            candidate_modules(changes, candidate, source=source, entry=ENTRY_MODULE, explain=False, base=base)
        except PatchError:
            return entry
    candidate_modules(changes, candidate, source=source, entry=ENTRY_MODULE, base=base)
    return ENTRY_MODULE


def check_base_importable(trees: Trees, entry: str = ENTRY_MODULE) -> ModuleType:
    """Import the entry module and check it comes from the base tree, not some other vLLM. A dependency
    vLLM imports that is not installed is one :class:`MissingDependencyError` naming it and the fix."""
    try:
        module = importlib.import_module(entry)
    except ModuleNotFoundError as exc:
        if exc.name is None or exc.name == "vllm" or exc.name.startswith("vllm."):
            raise
        raise MissingDependencyError(missing_module_message(exc.name, trees.manifest.vllm_version, trees.base)) from exc
    if not Path(module.__file__).resolve().is_relative_to(trees.base.resolve()):
        raise DataError(
            f"vLLM was imported from {module.__file__}, not from the base tree {trees.base}: "
            "put the base tree first on sys.path (the test and bench entry points do this)"
        )
    return module


def load_candidate(trees: Trees, entry: str = ENTRY_MODULE, during=None) -> ModuleType:
    """The candidate's entry module, with every changed module loaded from its tree. What the candidate loads
    comes from the trees themselves, which must still differ exactly as the manifest says."""
    forget_files()
    found = tuple(differences(trees.base, trees.candidate))
    if found != trees.manifest.changed_files:
        raise DataError(
            f"{trees.manifest_path}: the trees no longer differ as the manifest records (now: "
            f"{', '.join(c.path for c in found) or 'nothing'}): something changed them after the build; rebuild "
            "them (nox -s build, or rerun the session)"
        )
    names = candidate_modules(
        found, trees.candidate, source=str(trees.manifest.patch_path), entry=entry, base=trees.base
    )
    return load_modules(trees.candidate, names, during)[entry]


def load_variants(trees: Trees) -> tuple[Variant, Variant]:
    """The base and candidate ``marlin_moe`` modules; the base tree must be first on ``sys.path``."""
    base = check_base_importable(trees)
    return Variant("base", base), Variant("candidate", load_candidate(trees))


def put_base_first(trees: Trees) -> None:
    """Make the base tree the ``vllm`` that ``import vllm`` finds, imported from its sources (bytecode cached
    beside the trees, never in them); refuse if another vLLM is already imported."""
    already = sys.modules.get("vllm")
    if already is not None and not Path(already.__file__).resolve().is_relative_to(trees.base.resolve()):
        raise DataError(f"vllm is already imported from {already.__file__}; start a fresh process")
    import_tree_from_source(trees.base, trees.manifest_path.resolve().parent / BYTECODE_DIR)
    base = str(trees.base)
    if base not in sys.path:
        sys.path.insert(0, base)

"""Import vLLM's base and candidate code side by side in one process.

The base tree is imported the normal way (it is first on ``sys.path``). The candidate
differs from it only in the Python files the patch changed (the manifest lists them), and
both share the same compiled kernels, so the candidate is loaded as fresh module objects:
the changed modules and the entry module (``marlin_moe``) are executed from the candidate
tree while every other import resolves to the already-imported base. Base and candidate
then run interleaved on one GPU in one process, which is what fair A/B timing needs.

Limits, checked and refused with a message: a changed package ``__init__.py`` and changed
non-Python files. A change whose effect reaches the entry module only through an
*unchanged* intermediate module would not be seen; the shipped patch has no such reach.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

from ci.build import Trees
from ci.errors import DataError, MissingDependencyError, UsageError

ENTRY_MODULE = "vllm.model_executor.layers.fused_moe.experts.marlin_moe"


def module_name(rel_path: str) -> str:
    """``vllm/a/b.py`` -> ``vllm.a.b``; refuses what cannot be loaded twice."""
    path = Path(rel_path)
    if path.suffix != ".py":
        raise UsageError(
            f"the patch changes {rel_path}, not a Python module: base and candidate cannot share one "
            "process; only patches to vLLM's .py modules are supported"
        )
    if path.name == "__init__.py":
        raise UsageError(f"the patch changes the package file {rel_path}: loading it twice in one process is unsafe")
    return ".".join(path.with_suffix("").parts)


class _TreeFinder(importlib.abc.MetaPathFinder):
    """Serves the named modules from ``tree``; everything else falls through to the normal path."""

    def __init__(self, tree: Path, names: frozenset[str]) -> None:
        self.tree, self.names = tree, names

    def find_spec(self, fullname, path=None, target=None):
        if fullname not in self.names:
            return None
        file = self.tree / (fullname.replace(".", "/") + ".py")
        return importlib.util.spec_from_file_location(fullname, file)


def _parent_and_leaf(name: str) -> tuple[ModuleType, str]:
    parent_name, _, leaf = name.rpartition(".")
    return importlib.import_module(parent_name), leaf


def load_modules(tree: Path, names: list[str]) -> dict[str, ModuleType]:
    """Execute ``names`` from ``tree`` as new module objects; leave ``sys.modules`` as it was."""
    wanted = frozenset(names)
    parents = {n: _parent_and_leaf(n) for n in names}  # imports the parents (and what they import) first
    saved_modules = {n: sys.modules.get(n) for n in names}
    saved_attrs = {n: getattr(p, leaf, None) for n, (p, leaf) in parents.items()}
    for n in names:
        sys.modules.pop(n, None)
    finder = _TreeFinder(tree, wanted)
    sys.meta_path.insert(0, finder)
    try:
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
PACKAGE_OF = {"cpuinfo": "py-cpuinfo", "yaml": "pyyaml", "zmq": "pyzmq", "PIL": "pillow",
              "cv2": "opencv-python-headless", "google": "protobuf", "sklearn": "scikit-learn", "jwt": "pyjwt",
              "dateutil": "python-dateutil"}  # fmt: skip


def missing_module_message(module: str, version: str, tree: Path) -> str:
    """One clear line for a dependency the vLLM under test imports and this environment lacks."""
    top = module.split(".")[0]
    package = PACKAGE_OF.get(top, top.replace("_", "-"))
    return (
        f"vLLM {version} (the trees in {tree.parent}) imports {module!r}, which this environment does not have "
        f"(package {package!r}): the environment was made for another vLLM release. Run the CPU tier in an "
        f"environment made from vLLM {version}'s own Requires-Dist: nox -s \"tests_release(release='{version}')\" "
        "(add the release to FOLLOWED_RELEASES in noxfile.py if it is not listed), or `pip install "
        f"{package}` here for this one module"
    )


def check_base_importable(trees: Trees) -> ModuleType:
    """Import the entry module and check it comes from the base tree, not some other vLLM. A dependency
    vLLM imports that is not installed is one :class:`MissingDependencyError` naming it and the fix."""
    try:
        module = importlib.import_module(ENTRY_MODULE)
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


def load_variants(trees: Trees) -> tuple[Variant, Variant]:
    """The base and candidate ``marlin_moe`` modules; the base tree must be first on ``sys.path``."""
    base = check_base_importable(trees)
    names = [module_name(c.path) for c in trees.manifest.changed_files]
    if ENTRY_MODULE not in names:
        names.append(ENTRY_MODULE)
    return Variant("base", base), Variant("candidate", load_modules(trees.candidate, names)[ENTRY_MODULE])


def load_tree_module(tree: Path, rel_path: str) -> ModuleType:
    """Load one more variant of a module from another tree (e.g. a mutant candidate)."""
    return load_modules(tree, [module_name(rel_path)])[module_name(rel_path)]


def put_base_first(trees: Trees) -> None:
    """Make the base tree the ``vllm`` that ``import vllm`` finds; refuse if another is already imported."""
    already = sys.modules.get("vllm")
    if already is not None and not Path(already.__file__).resolve().is_relative_to(trees.base.resolve()):
        raise DataError(f"vllm is already imported from {already.__file__}; start a fresh process")
    base = str(trees.base)
    if base not in sys.path:
        sys.path.insert(0, base)

"""The manifest of two trees (base and candidate): what was built, from what, and where; written by
``ci.trees.build``, read by every stage that runs vLLM."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path

from ci.core.errors import DataError
from ci.core.jsonio import read_json
from ci.core.schema import BOOLEAN, STRING, ListOf, MapOf, OneOf, Opt, problem
from ci.trees.treediff import FileChange

MANIFEST_KIND = "vllm-trees"
MANIFEST_VERSION = 2  # 2: changed_files is what differs between the trees (ci.trees.treediff), each with its kind


@dataclass(frozen=True, kw_only=True)
class TreeManifest:
    """What was built: read by the test, bench and TPOT stages (paths relative to the manifest)."""

    vllm_version: str
    vllm_source: str
    patch_path: str
    patch_sha256: str
    reverse: bool
    base: str
    candidate: str
    changed_files: tuple[FileChange, ...]  # what differs between the two trees (ci.trees.treediff)
    ignored_patch_paths: tuple[str, ...] = ()
    overlaid_files: tuple[str, ...] = ()
    refs: dict | None = None  # --head-ref: the refs, their commits and the files the branch changes
    overlay: dict | None = None  # --vllm-src without refs, a git checkout: its commit (ci.trees.build.overlay_of)
    contract: dict | None = None  # ci.trees.contracts.Contract.to_json(), or None: no rule of the change is checked
    entry_module: str = ""  # the module the candidate is loaded through (ci.trees.variants); "": Marlin's
    tools: dict[str, str] = field(default_factory=dict)
    created_at: str = ""
    command: str = ""
    kind: str = MANIFEST_KIND
    schema_version: int = MANIFEST_VERSION

    def to_json(self) -> dict:
        return asdict(self)

    @property
    def base_is_release(self) -> bool:
        """The base tree is the release's code as published: no checkout overlaid, no change taken out."""
        return self.refs is None and not self.overlaid_files and not self.reverse


@dataclass(frozen=True, kw_only=True)
class Trees:
    """A manifest read back, with absolute paths to the two trees."""

    manifest_path: Path
    manifest: TreeManifest
    base: Path
    candidate: Path


CHANGE = {"path": STRING, "sha256_before": Opt(STRING), "sha256_after": Opt(STRING), "what": STRING}
FIELDS = {
    "vllm_version": STRING,
    "vllm_source": STRING,
    "patch_path": STRING,
    "patch_sha256": STRING,
    "reverse": BOOLEAN,
    "base": STRING,
    "candidate": STRING,
    "changed_files": ListOf(CHANGE),
    "ignored_patch_paths": Opt(ListOf(STRING)),
    "overlaid_files": Opt(ListOf(STRING)),
    "refs": Opt(MapOf(Opt(OneOf((STRING, ListOf(STRING)))))),
    "overlay": Opt({"repo": STRING, "commit": STRING, "subject": STRING, "status": STRING}),
    "contract": Opt({"path": STRING, "sha256": STRING}),
    "entry_module": Opt(STRING),
    "tools": Opt(MapOf(STRING)),
    "created_at": Opt(STRING),
    "command": Opt(STRING),
}


def load_trees(manifest_path: Path) -> Trees:
    """Read a manifest written by ``ci.trees.build.build_trees``; check the trees are still there."""
    payload = read_json(manifest_path, kind=MANIFEST_KIND, versions=(MANIFEST_VERSION,))
    payload = {k: v for k, v in payload.items() if k not in ("kind", "schema_version")}
    wrong = problem(payload, FIELDS, "manifest")
    if wrong:
        raise DataError(f"{manifest_path}: malformed tree manifest ({wrong}); rebuild with `nox -s build`")
    try:
        payload["changed_files"] = tuple(FileChange(**c) for c in payload["changed_files"])
        if not all(isinstance(c.path, str) for c in payload["changed_files"]):
            raise TypeError("a changed file's path is not a string")
        for key in ("ignored_patch_paths", "overlaid_files"):
            payload[key] = tuple(payload.get(key, ()))
        manifest = TreeManifest(**payload)
    except (KeyError, TypeError) as exc:
        raise DataError(f"{manifest_path}: malformed tree manifest ({exc}); rebuild with `nox -s build`") from exc
    root = manifest_path.resolve().parent
    trees = Trees(
        manifest_path=manifest_path, manifest=manifest, base=root / manifest.base, candidate=root / manifest.candidate
    )
    for tree in (trees.base, trees.candidate):
        if not (tree / "vllm" / "__init__.py").is_file():
            raise DataError(f"{manifest_path}: tree {tree} is missing or incomplete; rebuild with `nox -s build`")
    return trees

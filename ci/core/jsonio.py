"""Versioned JSON files: every stored result names its kind and schema version.

Readers refuse a file of the wrong kind or an unknown version with a message naming the
file and the fix (asv's ``util.load_json`` does the same); writers are atomic, so a
crash never leaves half a baseline behind.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import tempfile
from pathlib import Path
from typing import Any

from ci.core.errors import DataError

_NUMBER_LIST = re.compile(r"\[\s*(-?[\d.eE+-]+(?:,\s*-?[\d.eE+-]+)*)\s*\]")


def _finite(value: Any) -> Any:
    """Non-finite floats (an interval too wide to bound) become null: JSON has no Infinity."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


def dumps(payload: dict[str, Any]) -> str:
    """Indented JSON with each list of numbers on one line (raw samples stay one line a series)."""
    text = json.dumps(_finite(payload), indent=1, sort_keys=True, allow_nan=False)
    return _NUMBER_LIST.sub(lambda m: "[" + ", ".join(x.strip() for x in m[1].split(",")) + "]", text)


def sha256_file(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def write_json(path: Path, payload: dict[str, Any]) -> None:
    """Write ``payload`` to ``path`` atomically (temporary file + rename), diff-friendly."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as fh:
            fh.write(dumps(payload) + "\n")
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def load_json(path: Path) -> Any:
    """The JSON value in ``path``; a file that is not JSON, not UTF-8 or nested past what Python can read is
    one :class:`DataError` naming it."""
    try:
        return json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise DataError(f"{path}: not valid JSON ({exc}); the file is corrupt: re-create it") from exc
    except RecursionError:
        raise DataError(
            f"{path}: JSON nested too deeply to read; no stage of this gate writes such a file: re-create it"
        ) from None


def read_json(path: Path | str, *, kind: str | None, versions: tuple[int, ...]) -> dict[str, Any]:
    """Read a file written by :func:`write_json`, checking its ``kind`` (``None``: any, checked by
    the caller) and ``schema_version``."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"{path}: no such file")
    return check_header(load_json(path), path, kind=kind, versions=versions)


def check_header(payload: Any, path: Path | str, *, kind: str | None, versions: tuple[int, ...]) -> dict[str, Any]:
    """``payload`` (read from ``path``) is an object of ``kind`` (``None``: any) at one of ``versions``."""
    if not isinstance(payload, dict):
        raise DataError(f"{path}: expected a JSON object, found {type(payload).__name__}")
    found_kind = payload.get("kind")
    if kind is not None and found_kind != kind:
        raise DataError(f"{path}: expected a {kind!r} file, found kind={found_kind!r}")
    version = payload.get("schema_version")
    if type(version) is not int or version not in versions:  # true == 1 in Python: a version is an integer
        raise DataError(
            f"{path}: schema_version={version!r} is not one this gate reads {versions}; "
            "re-create the file with this version of the gate"
        )
    return payload


def require(payload: dict[str, Any], key: str, typ: type | tuple[type, ...], where: Path | str) -> Any:
    """Return ``payload[key]``, or a :class:`DataError` naming the file, the key and what was found."""
    if key not in payload:
        raise DataError(f"{where}: missing field {key!r}")
    value = payload[key]
    if not isinstance(value, typ):
        raise DataError(f"{where}: field {key!r} should be {typ}, found {value!r}")
    return value


def check_own_report(out: Path, json_name: str, md_name: str, *, kind: str, version: int) -> None:
    """A stage that writes ``json_name`` (of ``kind``) and ``md_name`` into the folder ``out`` replaces only its own
    files there: a file of either name it did not write stops it with a :class:`UsageError`, nothing changed."""
    from ci.core.errors import UsageError

    if out.suffix == ".json" or (out.exists() and not out.is_dir()):
        raise UsageError(f"--out {out}: pass a folder (the stage writes {json_name} and {md_name} into it)")
    mine = out / json_name
    if mine.exists():
        try:
            read_json(mine, kind=kind, versions=(version,))
        except DataError:
            raise UsageError(
                f"--out {out}: {json_name} there was not written by this stage; pick another folder "
                "(nothing was changed)"
            ) from None
    elif (out / md_name).exists():
        raise UsageError(
            f"--out {out}: {md_name} there was not written by this stage (no {json_name} beside it); "
            "pick another folder (nothing was changed)"
        )


def write_report(out: Path, json_name: str, md_name: str, payload: dict[str, Any], text: str) -> None:
    """The stage's two outputs into ``out``: the payload (atomically) and its Markdown; the Markdown printed too."""
    out.mkdir(parents=True, exist_ok=True)
    write_json(out / json_name, payload)
    (out / md_name).write_text(text)
    print(text, end="")

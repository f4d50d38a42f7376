"""The one way this project patches vLLM: attributes of a loaded module replaced for a block, restored on exit
(forcing and recording a tile or a config, the CPU tier's spies, a skipped op registration)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator


@contextlib.contextmanager
def swapped(owner, **replacements) -> Iterator[None]:
    """Replace attributes of ``owner`` (a vLLM module, or its ``ops``) for the block, restored on exit whatever
    happens: the one way this project patches vLLM (forcing and recording the tile, the CPU tier's spies)."""
    saved = {name: getattr(owner, name) for name in replacements}
    for name, value in replacements.items():
        setattr(owner, name, value)
    try:
        yield
    finally:
        for name, value in saved.items():
            setattr(owner, name, value)

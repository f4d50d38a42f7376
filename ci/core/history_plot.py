"""The drawing of a history (``nox -s history -- plot``): each case's series on the history's run axis, its
candidate change points marked. Apart from ``ci.core.history`` because it draws and decides nothing: the
history's reading, adding and change points are in the mutation run, this is not."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from ci.core.errors import UsageError
from ci.core.history import case_series, value


def plot(history: dict, out: Path, found: Sequence[dict] = (), pattern: str = "*", most: int = 12) -> int:
    """Each case's series of its published side (at most ``most`` cases), its candidate change points marked;
    returns the number of cases drawn."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    series = dict(list(case_series(history, pattern).items())[:most])
    if not series:
        raise UsageError(f"no case of the history matches {pattern!r}; nothing drawn")
    fig, axes = plt.subplots(len(series), 1, figsize=(9, 2.2 * len(series)), squeeze=False)
    run_of = {id(e): i for i, e in enumerate(history["entries"])}  # every case on the history's run axis
    for ax, (cid, entries) in zip(axes[:, 0], series.items(), strict=True):
        at = [run_of[id(e)] for e in entries]
        ax.plot(at, [value(e, cid) for e in entries], marker="o", markersize=3)
        ax.set_xlim(-0.5, len(history["entries"]) - 0.5)
        for c in found:
            if c["case"] == cid:
                where = (at[c["index"] - 1] + at[c["index"]]) / 2
                ax.axvline(where, color="red", linestyle="--", label=f"candidate {c['size']:+.1%}")
        ax.set_title(cid, fontsize=8)
        ax.set_ylabel(entries[0]["cases"][cid]["unit"], fontsize=8)
        if any(c["case"] == cid for c in found):
            ax.legend(fontsize=7)
    axes[-1, 0].set_xlabel("run (in the history's order)")
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=90)
    plt.close(fig)
    return len(series)

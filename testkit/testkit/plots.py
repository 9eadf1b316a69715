"""matplotlib for files: no display, one call to make a figure and one to save it."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def pyplot() -> Any:
    """matplotlib.pyplot on the Agg backend (benchmarks run headless and only write files)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save(fig: Any, path: Path, **savefig: Any) -> Path:
    """fig as `path` (its folder made), then closed."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, **savefig)
    pyplot().close(fig)
    return path

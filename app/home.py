"""The project's one cache folder: the embedded model and its wheels (`app/engine`), the demo
tools' notes (`app/tools`), the benchmark's datasets. Here, below both the engine and the tools,
so each may import it."""

from __future__ import annotations

import os
from pathlib import Path


def model_home() -> Path:
    """Root of ooo-spec's cache: `$OOO_SPEC_HOME`, else `$XDG_CACHE_HOME/ooo-spec`."""
    explicit = os.environ.get("OOO_SPEC_HOME")
    if explicit:
        return Path(explicit).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return base / "ooo-spec"

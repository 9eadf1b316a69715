"""Where things are in the checkout, and where benchmarks write."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

REPO = Path(__file__).resolve().parents[2]
HACK = REPO / "hack"
CRD_FILE = REPO / "crds" / "autoglm.io_autoglmdeployments.yaml"
# Every benchmark's JSON and PNG, and the demo's chart under its own folder.
OUT_DIR = REPO / "out" / "bench"
BENCHMARK_PAGES = REPO / "docs" / "benchmarks"


def load_script(relative: str) -> ModuleType:
    """A script of the checkout (hack/x.py, bench/x.py) as a module, for the tests that check it.

    Scripts are not packages; loading one by path keeps them runnable as `python <path>`
    without a search path entry for each folder. Loaded once: later calls return the same module.
    """
    path = REPO / relative
    name = path.stem
    loaded = sys.modules.get(name)
    if loaded is not None and Path(loaded.__file__ or "") == path:
        return loaded
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None, path
    module = importlib.util.module_from_spec(spec)
    # Registered before it runs: dataclasses and pickling look their module up by name.
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module

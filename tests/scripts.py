"""Loading bench/ and scripts/ files as modules for their tests: they are scripts, not a package."""
import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def load_script(relative: str):
    """The module of the file at `relative` to the repository root, loaded with its folder importable
    while it loads (a bench imports its neighbours, e.g. bench/hlo.py)."""
    path = ROOT / relative
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    sys.path.insert(0, str(path.parent))
    try:
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(path.parent))
    return module

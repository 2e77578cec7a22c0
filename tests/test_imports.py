"""Imports flow one way: envs and models at the bottom, sampling and rollout above them, rl and eval
above those, the trainer loop and the command line on top."""
import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "spiral_jax"

# Each module's layer; a module may import only from its own layer or below.
LAYERS = {
    "models": 0, "envs": 0, "sharding": 0, "templates": 0, "tokenizer": 0, "distributed": 0,
    "compilation": 0, "metrics": 0, "paths": 0, "api_player": 0, "api_http": 0, "hardware": 0, "policies": 0,
    "sampling": 1, "rollout": 1, "checkpoint": 1, "checkpoint_layout": 1,
    "rl": 2, "eval": 2, "serve": 2,
    "config": 1,
    "run": 3, "run_dir": 3, "plan": 3, "aot": 3, "export": 3,
    "cli": 4, "cli_errors": 4, "launch": 4,
}


def _layer(module: str) -> int:
    parts = module.split(".")
    for n in range(len(parts), 0, -1):
        if ".".join(parts[:n]) in LAYERS:
            return LAYERS[".".join(parts[:n])]
    raise AssertionError(f"spiral_jax.{module} has no layer in tests/test_imports.py")


def _imports(path: Path):
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("spiral_jax."):
            yield node.module[len("spiral_jax."):]
        elif isinstance(node, ast.Import):
            yield from (a.name[len("spiral_jax."):] for a in node.names if a.name.startswith("spiral_jax."))


def test_no_module_imports_from_a_layer_above_it():
    upward = []
    for path in sorted(PACKAGE.rglob("*.py")):
        module = ".".join(path.relative_to(PACKAGE).with_suffix("").parts)
        if module in ("__init__",):
            continue
        for imported in _imports(path):
            if _layer(imported) > _layer(module):
                upward.append(f"spiral_jax.{module} imports spiral_jax.{imported}")
    assert not upward, "\n".join(upward)


def test_eval_never_imports_rl():
    for path in sorted((PACKAGE / "eval").rglob("*.py")):
        assert not [m for m in _imports(path) if m == "rl" or m.startswith("rl.")], path


def test_the_config_schema_sits_below_rl():
    """config.py is the schema: it builds nothing, so rl/ and everything else may read it."""
    imported = set(_imports(PACKAGE / "config.py"))
    assert imported <= {"templates"}, imported



def test_only_the_config_reader_imports_ml_collections():
    """The config travels no deeper than the command line and the one module that reads it into a
    RunSpec: everything else takes typed values."""
    readers = sorted(str(path.relative_to(PACKAGE)) for path in PACKAGE.rglob("*.py")
                     if "ml_collections" in path.read_text())
    assert readers == ["cli.py", "config.py", "run/setup.py"], readers


def test_no_module_outside_models_is_over_400_lines():
    long = {str(p.relative_to(PACKAGE)): n for p in PACKAGE.rglob("*.py")
            if p.relative_to(PACKAGE).parts[0] != "models" and (n := len(p.read_text().splitlines())) > 400}
    assert not long, long


def test_an_older_jax_is_named_on_import_and_setup_requires_the_same_floor():
    import spiral_jax

    floor = re.search(r'^JAX_MIN = "([\d.]+)"$', (PACKAGE.parent / "setup.py").read_text(), re.M)
    assert floor and floor[1] == spiral_jax.JAX_MIN
    for fine in (spiral_jax.JAX_MIN, "0.10.2.dev20261201", "0.12.0.1", "1.0"):
        spiral_jax.check_jax_version(fine)
    for old in ("0.9.2", "0.6.0", "0.4.38"):
        with pytest.raises(ImportError, match=rf"needs jax {spiral_jax.JAX_MIN} or newer, and this environment "
                                              rf"has jax {re.escape(old)}; upgrade it with pip install -U"):
            spiral_jax.check_jax_version(old)
    # The package runs the check as it is imported.
    patched = ("import importlib.metadata as m; real = m.version; "
               "m.version = lambda name: '0.6.0' if name == 'jax' else real(name); import spiral_jax")
    result = subprocess.run([sys.executable, "-c", patched], capture_output=True, text=True, cwd=PACKAGE.parent)
    assert result.returncode == 1 and "ImportError: spiral-jax needs jax" in result.stderr, result.stderr

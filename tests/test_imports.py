"""The import graph: every module imports on its own in a fresh interpreter (an import circle
fails there, whatever order a test run happened to import things in), and the pure layers,
uma.sched above all, import without the compiled core."""

from __future__ import annotations

import pkgutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest

import uma

MODULES = ["uma"] + sorted(m.name for m in pkgutil.walk_packages(uma.__path__, "uma.")
                 if m.name not in ("uma.__main__", "uma._core"))
# What must work where the core is not built yet: scheduling policies, configuration, the wire
# protocol and the client that speaks it, the synthetic model writer, and the engine itself on
# the fake core.
PURE = [m for m in MODULES if m.startswith(("uma.sched", "uma.wire"))] + [
    "uma", "uma.client", "uma.config", "uma.checks", "uma.knobs", "uma.errors", "uma.priority",
    "uma.metrics", "uma.scorecard", "uma.handle", "uma.synth", "uma.service", "uma.server.settings",
    "uma.server.prometheus", "uma.engine", "uma.engine.engine", "uma.engine.scheduler",
    "uma.engine.prefix_index", "uma.fake_core", "uma.testing",
]
BLOCK_CORE = "import sys; sys.modules['uma._core'] = None; "


def imports(module: str, prelude: str = "") -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", f"{prelude}import {module}"],
                          capture_output=True, text=True, timeout=120)


def run_all(modules: list[str], prelude: str = "") -> dict[str, str]:
    """module -> the error of importing it alone ('' if it imported)."""
    with ThreadPoolExecutor(4) as pool:
        results = pool.map(lambda m: (m, imports(m, prelude)), modules)
        return {m: r.stderr.strip().splitlines()[-1] if r.returncode else ""
                for m, r in results}


def test_every_module_imports_alone():
    failed = {m: e for m, e in run_all(MODULES).items() if e}
    assert not failed, failed


@pytest.mark.parametrize("unused", [None])  # one test: the modules are listed in its message
def test_the_pure_layers_import_without_the_compiled_core(unused):
    assert set(PURE) <= set(MODULES)
    failed = {m: e for m, e in run_all(PURE, BLOCK_CORE).items() if e}
    assert not failed, failed

"""Every benchmark script and peer imports on a CPU machine without torch's GPU parts: a
script whose import breaks (a name moved to another module, as a merge once left
profile_protocols.py importing FERRY_ENV from bench_e2e after it moved to e2e_systems)
fails here, not in the GPU session that runs it."""

from __future__ import annotations

import importlib
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
MODULES = sorted(
    ".".join(p.relative_to(ROOT).with_suffix("").parts)
    for folder in ("benchmarks", "benchmarks/peers", "loadtest")
    for p in (ROOT / folder).glob("*.py")
    # (not the locust file: locust patches the whole process with gevent; it runs alone)
    if p.name not in ("__init__.py", "locustfile.py")
)


@pytest.mark.parametrize("module", MODULES)
def test_imports(module):
    importlib.import_module(module)

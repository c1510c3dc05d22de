"""Shared fixtures: where the datasets are, and the GPU gate.

The parity data (``datasets/`` with ``REFERENCE_VALUES.json``, listed in ``datasets/PROVENANCE.md``) ships
with the repository, so no CPU test skips for want of data. The large benchmark corpus
(``../shared/datasets/structures``) is not shipped and no test uses it: only the benchmarks read it.

GPU tests carry ``@pytest.mark.gpu`` and take the ``gpu`` fixture. Without a usable GPU they skip,
unless ``PROTGPU_REQUIRE_GPU=1`` is set (as on the GPU machine), in which case they fail: a skipped GPU
suite proves nothing.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
DATASETS = REPO / "datasets"


def require_gpu() -> bool:
    return os.environ.get("PROTGPU_REQUIRE_GPU", "") not in ("", "0")


@pytest.fixture(scope="session")
def gpu():
    """The ``cupy`` module, for tests that need a usable GPU."""
    from protgpu._array import gpu_available, gpu_unavailable_reason

    if not gpu_available():
        msg = f"no usable GPU: {gpu_unavailable_reason()}"
        if require_gpu():
            pytest.fail(f"PROTGPU_REQUIRE_GPU=1 but {msg}")
        pytest.skip(msg)
    import cupy

    return cupy


def pytest_collection_modifyitems(config, items):
    # Tests marked gpu without the fixture still get the gate.
    for item in items:
        if item.get_closest_marker("gpu") and "gpu" not in getattr(item, "fixturenames", ()):
            item.fixturenames.append("gpu")


@pytest.fixture(scope="session")
def datasets() -> Path:
    """The repository's own ``datasets/`` folder: the adenylate kinase files and the parity data
    (``biopython/``, ``mdtraj/``, ``openstructure/``, ``usalign/``, ``REFERENCE_VALUES.json``)."""
    return DATASETS


@pytest.fixture(scope="session")
def shared_datasets(datasets) -> Path:
    """Alias of ``datasets``: the parity data shipped in ``datasets/`` (the name is from when it lived in
    ``../shared/datasets`` beside the checkout)."""
    return datasets


@pytest.fixture(scope="session")
def reference_values(datasets):
    """``datasets/REFERENCE_VALUES.json``, parsed."""
    import json

    return json.loads((datasets / "REFERENCE_VALUES.json").read_text())

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
            # a new list: the items of one parametrized function share one fixturenames list
            item.fixturenames = [*item.fixturenames, "gpu"]


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


def pytest_generate_tests(metafunc):
    # The array-kind fixture's parameters, with the gpu mark on the CuPy one only (marks on a fixture's
    # own params reach every test using the fixture).
    if "array_kind" in metafunc.fixturenames:
        kinds = ["numpy", "torch", pytest.param("cupy", marks=pytest.mark.gpu)]
        metafunc.parametrize("array_kind", kinds, indirect=True)


@pytest.fixture
def array_kind(request):
    """``(name, convert)``: ``convert`` turns a NumPy array into the same array of that library (NumPy,
    torch on the CPU, CuPy). torch skips when it is not installed; CuPy needs a usable GPU (and fails
    instead of skipping under ``PROTGPU_REQUIRE_GPU=1``, as every GPU test does)."""
    kind = request.param
    if kind == "numpy":
        return kind, lambda a: a
    if kind == "torch":
        torch = pytest.importorskip("torch")
        return kind, lambda a: torch.from_numpy(a.copy())
    cupy = request.getfixturevalue("gpu")
    return kind, cupy.asarray

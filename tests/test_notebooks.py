"""The example notebooks in ``notebooks/``: stored without outputs, and each runs top to bottom.

Execution uses nbclient + nbformat + ipykernel (the ``test`` extra) and is skipped cleanly without
them. The kernel gets the environment of the test run minus ``PROTGPU_DISABLE_GPU``, so the notebooks
use ``device="auto"``: the CPU in CI, the GPU on a GPU machine. ``test_notebook_runs_on_gpu`` (GPU
suite) also checks that they really computed on the GPU there. Files the notebooks write go to a
temporary folder (``PROTGPU_NOTEBOOK_OUTPUT``), and the kernel imports this checkout of protgpu.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((REPO / "notebooks").glob("*.ipynb"))
CELL_TIMEOUT_S = 300
NOTEBOOK_LIMIT_S = 240  # each notebook; together they take about 1.5 min on 2 CPU cores

# What each notebook must leave behind in its output folder (checked after it ran).
OUTPUT_FILES = {
    "01_distances_and_contacts.ipynb": ["adk_contact_frequency.png"],
    "02_rmsd_and_clustering.ipynb": ["cluster_representatives.pdb", "cluster_gromos.png",
                                     "gromos_representatives.pdb"],
}


def _ids(paths):
    return [p.stem for p in paths]


def test_there_are_notebooks():
    assert len(NOTEBOOKS) >= 5, [p.name for p in NOTEBOOKS]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=_ids(NOTEBOOKS))
def test_notebook_is_stored_without_outputs(path):
    nb = json.loads(path.read_text())
    assert nb.get("nbformat") == 4
    assert nb["metadata"].get("kernelspec", {}).get("name") == "python3"
    for k, cell in enumerate(nb["cells"]):
        if cell["cell_type"] != "code":
            continue
        assert cell.get("outputs") == [], f"{path.name} cell {k} has outputs: strip them before committing"
        assert cell.get("execution_count") is None, f"{path.name} cell {k} has an execution count"
    assert "widgets" not in nb["metadata"]


def _execute(path: Path, out_dir: Path):
    """Run a notebook in a fresh kernel from its own folder; return the executed notebook and seconds."""
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    pytest.importorskip("ipykernel")
    pytest.importorskip("matplotlib")

    nb = nbformat.read(path, as_version=4)
    env = dict(os.environ)
    env.pop("PROTGPU_DISABLE_GPU", None)  # device="auto": the GPU wherever one is usable
    env["PROTGPU_NOTEBOOK_OUTPUT"] = str(out_dir)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
    env["MPLBACKEND"] = "module://matplotlib_inline.backend_inline"
    client = nbclient.NotebookClient(nb, timeout=CELL_TIMEOUT_S, kernel_name="python3",
                                     resources={"metadata": {"path": str(path.parent)}})
    t0 = time.perf_counter()
    client.execute(env=env)  # raises CellExecutionError, with the cell and traceback, on any error
    return nb, time.perf_counter() - t0


def _outputs(nb, kind: str) -> list:
    found = []
    for cell in nb.cells:
        for out in cell.get("outputs", []):
            if kind == "text" and out.get("output_type") == "stream":
                found.append(out.get("text", ""))
            elif kind == "image" and "image/png" in out.get("data", {}):
                found.append(out["data"]["image/png"])
    return found


def _check_ran(path: Path, nb, seconds: float, out_dir: Path) -> None:
    assert seconds < NOTEBOOK_LIMIT_S, f"{path.name} took {seconds:.0f} s (limit {NOTEBOOK_LIMIT_S} s)"
    assert _outputs(nb, "image"), f"{path.name} drew no figure"
    for name in OUTPUT_FILES.get(path.name, []):
        assert (out_dir / name).is_file(), f"{path.name} did not write {name}"


@pytest.mark.slow
@pytest.mark.parametrize("path", NOTEBOOKS, ids=_ids(NOTEBOOKS))
def test_notebook_runs(path, tmp_path):
    nb, seconds = _execute(path, tmp_path)
    _check_ran(path, nb, seconds, tmp_path)
    if path.name == "02_rmsd_and_clustering.ipynb":
        import protgpu as pg

        reps = pg.load(tmp_path / "cluster_representatives.pdb")
        assert reps.n_frames == 4 and reps.n_atoms == 3341
        assert reps.select("ca").n_atoms == 214  # elements written correctly (CA is carbon)
        central = pg.load(tmp_path / "gromos_representatives.pdb")  # pg.cluster's medoids, through pg.save
        assert central.n_frames >= 2 and central.n_atoms == 3341 and central.select("ca").n_atoms == 214


@pytest.mark.gpu
@pytest.mark.parametrize("path", NOTEBOOKS, ids=_ids(NOTEBOOKS))
def test_notebook_runs_on_gpu(path, tmp_path, gpu):
    nb, seconds = _execute(path, tmp_path)
    _check_ran(path, nb, seconds, tmp_path)
    first = "".join(_outputs(nb, "text")[:1])
    assert "computes on the GPU" in first, f"{path.name} did not use the GPU: {first!r}"

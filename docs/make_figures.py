"""Make the figures the README and the documentation show, from the repository's own data.

    python3 docs/make_figures.py            # writes docs/_static/adk_contact_map.png

The figure is the residue distance map of adenylate kinase in its open form (``datasets/adk_open.pdb``,
214 residues, closest heavy atoms), drawn by :func:`protgpu.plotting.heatmap` exactly as
``protgpu contacts datasets/adk_open.pdb --plot map.png`` draws it, at a resolution that keeps the PNG
small enough for the repository (under 200 KB). It runs on the CPU or the GPU (``--device``); the map
is the same either way.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

DOCS = Path(__file__).resolve().parent
REPO = DOCS.parent
MAX_BYTES = 200 * 1024


def adk_contact_map(out: Path, device: str = "auto", dpi: int = 110) -> Path:
    """Draw the residue distance map of ``datasets/adk_open.pdb`` to ``out`` (PNG) and return it."""
    sys.path.insert(0, str(REPO))
    import numpy as np

    import protgpu as pg
    from protgpu.plotting import heatmap

    s = pg.load(REPO / "datasets" / "adk_open.pdb")
    cm = pg.contacts(s, scheme="closest-heavy", cutoff=4.5, device=device)
    d = np.asarray(cm.distances[0], dtype=np.float64)
    numbers = [str(n) for n in cm.residues.number.tolist()]
    title = "Adenylate kinase (4AKE, open): residue distances, closest heavy atoms"
    return heatmap(d, out, xlabels=numbers, title=title,
                   xlabel="residue", ylabel="residue", cbar_label="distance (Å)", vmin=0.0, vmax=4 * cm.cutoff,
                   cmap="viridis_r", max_ticks=12, dpi=dpi, size=5.5)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Make the documentation's figures.")
    ap.add_argument("--out", default=str(DOCS / "_static"), help="folder for the PNG files (default docs/_static)")
    ap.add_argument("--device", choices=("auto", "cpu", "gpu"), default="auto")
    args = ap.parse_args(argv)
    folder = Path(args.out)
    folder.mkdir(parents=True, exist_ok=True)
    path = adk_contact_map(folder / "adk_contact_map.png", device=args.device)
    size = path.stat().st_size
    print(f"{path}: {size / 1024:.0f} KB")
    if size > MAX_BYTES:
        print(f"{path}: larger than {MAX_BYTES // 1024} KB; lower the dpi", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

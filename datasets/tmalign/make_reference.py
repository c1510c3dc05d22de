"""Write reference.json: TM-align's numbers (tmtools 0.3.0, which wraps US-align's TMalign code) for the
pairs of small chains in this folder, so that the CPU suite checks pg.tm_align's parity without
tmtools installed.

Run from the repository root: ``python3 datasets/tmalign/make_reference.py`` (needs tmtools). The chains
are read by protgpu's chain reader (first protein chain, CA atoms, one-letter sequence) and handed to
tmtools as arrays, so the reference isolates the algorithm; the stored sequences and lengths let the
test check the reader too.
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import numpy as np
import tmtools

from protgpu.align.chains import one_chain

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent

SCOPE = ["d1cxya_", "d3lf5a_", "d2a6ca1", "d1neqa_", "d1t3ba2", "d2nwta1"]  # CA-only (UNK) traces
PAIRS = [(f"tmalign/{a}.pdb", f"tmalign/{b}.pdb") for a, b in itertools.combinations(SCOPE, 2)]
PAIRS += [
    ("tmalign/d3lf5a_.pdb", "tmalign/d1cxya_.pdb"),  # same superfamily, the other direction
    ("tmalign/1e79h.pdb", "tmalign/1fs0e.pdb"),  # HOMSTRAD pair (equal lengths)
    ("tmalign/1fs0e.pdb", "tmalign/1e79h.pdb"),
    ("tmalign/d1cida1.pdb", "tmalign/d1dcea2.pdb"),  # circular-permutation pair (sequential mode)
    ("tmalign/d1dcea2.pdb", "tmalign/d1cida1.pdb"),
    ("usalign/PDB1.pdb", "usalign/PDB2.pdb"),  # US-align's example pair
]


def main() -> None:
    rows = []
    for a, b in PAIRS:
        x, y = one_chain(str(ROOT / a), a), one_chain(str(ROOT / b), b)
        r = tmtools.tm_align(x.ca, y.ca, x.sequence, y.sequence)
        aligned = [k for k, c in enumerate(r.seqM) if c != " "]
        same = sum(r.seqxA[k] == r.seqyA[k] for k in aligned)
        rows.append({
            "mobile": a, "target": b, "L1": len(x.ca), "L2": len(y.ca),
            "seq_mobile": x.sequence, "seq_target": y.sequence,
            "tm_mobile": r.tm_norm_chain1, "tm_target": r.tm_norm_chain2, "rmsd": r.rmsd,
            "n_aligned": len(aligned), "seq_identity": same / len(aligned),
            "rotation": np.asarray(r.u).tolist(), "translation": np.asarray(r.t).tolist(),
            "mobile_aligned": r.seqxA, "target_aligned": r.seqyA, "match": r.seqM,
        })
    out = {"generator": "datasets/tmalign/make_reference.py", "tmtools": getattr(tmtools, "__version__", "0.3.0"),
           "pairs": rows}
    (HERE / "reference.json").write_text(json.dumps(out, indent=1) + "\n")
    print(f"wrote {len(rows)} pairs to {HERE / 'reference.json'}")


if __name__ == "__main__":
    main()

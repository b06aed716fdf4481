"""Runs an exported MindIR in this (fresh) process: ``mindspore.load`` + ``nn.GraphCell`` on the golden inputs.

Usage: python -m ms_swiglu.export.verify MODEL.mindir GOLDEN_DIR DTYPE
Prints one JSON line ``{"ok": bool, "cases": [...]}``; exit status 0 when every case is within tolerance.
"""
import glob
import json
import os
import sys

import numpy as np

from ms_swiglu.config import TOLERANCE as TOL


def main(argv=None):
    mindir, golden, dtype = argv or sys.argv[1:]
    import mindspore as ms  # noqa: PLC0415
    from mindspore import nn  # noqa: PLC0415

    ms.set_device("CPU")
    ms.set_context(mode=ms.GRAPH_MODE)
    cell = nn.GraphCell(ms.load(mindir))
    atol, rtol = TOL[dtype]
    cases = []
    for x_path in sorted(glob.glob(os.path.join(golden, "input_*.npy"))):
        y_path = x_path.replace("input_", "output_")
        x = ms.Tensor(np.load(x_path)).astype(getattr(ms, dtype))
        got = cell(x).astype(ms.float32).asnumpy().astype(np.float64)
        want = np.load(y_path).astype(np.float64)
        err = np.abs(got - want)
        ok = got.shape == want.shape and bool(np.all(err <= atol + rtol * np.abs(want)))  # NaN: not verified
        cases.append({"input": os.path.basename(x_path), "shape": list(x.shape), "max_abs_err": float(np.max(err)),
                      "ok": ok})
    result = {"ok": bool(cases) and all(c["ok"] for c in cases), "cases": cases, "tolerance": [atol, rtol]}
    print(json.dumps(result))
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())

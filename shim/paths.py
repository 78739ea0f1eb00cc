"""Where the native build outputs of the shim live (made by shim/build.py)."""
from __future__ import annotations

from pathlib import Path

SHIM_DIR = Path(__file__).resolve().parent
LIB_DIR = SHIM_DIR / "lib"
LIBCOLOCATE = LIB_DIR / "libcolocate.so"
SIMGPU_DIR = LIB_DIR / "simgpu"          # the test device: libcudart.so.13, libcuda.so.1, ...
SIMGPU_CUDART = SIMGPU_DIR / "libcudart.so.13"
SIMGPU_DRIVER = SIMGPU_DIR / "libcuda.so.1"   # its driver API, over the same device
EXPORTS = SHIM_DIR / "exports.txt"       # the symbols libcolocate.so may export


def require_built() -> None:
    """Raise a clear error when the native libraries have not been built."""
    missing = [p for p in (LIBCOLOCATE, SIMGPU_CUDART) if not p.exists()]
    if missing:
        names = ", ".join(str(p) for p in missing)
        raise FileNotFoundError(f"native shim libraries missing ({names}); run `make build`")

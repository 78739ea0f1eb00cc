"""colocate control plane: the controller daemon (`colocate serve`), its
protocol, the policies it runs and the `colocate` command line."""
from __future__ import annotations

from shim.rundir import ColocateError, version

__version__ = version()
__all__ = ["ColocateError", "__version__"]

"""colocate control plane: the controller daemon (`colocate serve`), its
protocol, the policies it runs and the `colocate` command line."""
from __future__ import annotations

from typing import TYPE_CHECKING

from shim.rundir import ColocateError

__all__ = ["ColocateError", "__version__"]

if TYPE_CHECKING:
    __version__: str
else:
    def __getattr__(name: str) -> str:
        # importlib.metadata costs 50 ms, paid by every `colocate` command: read
        # the version only when someone asks for it, once
        if name == "__version__":
            from shim.rundir import version
            globals()["__version__"] = v = version()
            return v
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

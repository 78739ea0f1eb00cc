"""The runtime directory: where a controller and its applications meet.

    DIR/ctl.sock       ZeroMQ ROUTER endpoint (ipc://DIR/ctl.sock)
    DIR/ctlblock       shared control block (shim/proto/ctlblock.h)
    DIR/serve.pid      pid of the controller (locked while it runs)
    DIR/serve.log      controller log
    DIR/history.jsonl  final records of exited apps
    DIR/simgpu/        simgpu's arena and report (device sim)
    DIR/apps/          one ledger per registered app (shim/proto/ledger.h)
"""
from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from pathlib import Path

ENV = "COLOCATE_RUNTIME_DIR"
_SUN_PATH_MAX = 107  # sockaddr_un.sun_path, minus the terminating NUL


class ColocateError(Exception):
    """A user-facing failure: the CLI prints the message (no traceback) and
    exits with `code`.  (Defined here, the bottom module, and re-exported by
    the package.)"""

    def __init__(self, message: str, code: int = 1):
        super().__init__(message)
        self.code = code


def version() -> str:
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as dist_version
    try:
        return dist_version("colocate")
    except PackageNotFoundError:
        return "0+unknown"


class RuntimeDirError(ColocateError):
    pass


def default() -> Path:
    if os.environ.get(ENV):
        return Path(os.environ[ENV])
    if os.environ.get("XDG_RUNTIME_DIR"):
        return Path(os.environ["XDG_RUNTIME_DIR"]) / "colocate"
    return Path(f"/tmp/colocate-{os.getuid()}")


@dataclass(frozen=True)
class RunDir:
    path: Path

    @property
    def sock(self) -> Path:
        return self.path / "ctl.sock"

    @property
    def endpoint(self) -> str:
        return f"ipc://{self.sock}"

    @property
    def ctlblock(self) -> Path:
        return self.path / "ctlblock"

    @property
    def pidfile(self) -> Path:
        return self.path / "serve.pid"

    @property
    def log(self) -> Path:
        return self.path / "serve.log"

    @property
    def history(self) -> Path:
        return self.path / "history.jsonl"

    @property
    def simgpu(self) -> Path:
        return self.path / "simgpu"

    @property
    def apps(self) -> Path:
        """The apps' ledgers: kernel tables and counts that survive any message loss."""
        return self.path / "apps"

    def ledger(self, slot: int, pid: int) -> Path:
        """The path the shim maps too (shim_ledger.c builds the same name)."""
        return self.apps / f"{slot}-{pid}.ledger"

    @property
    def modules(self) -> Path:
        """Fat binaries the apps' shims ship to pool workers (one file per binary)."""
        return self.path / "modules"


def check(path: Path) -> None:
    """Refuse a directory another user owns or others may write to."""
    st = path.lstat()
    if stat.S_ISLNK(st.st_mode):
        raise RuntimeDirError(f"runtime dir {path} is a symlink; refusing it")
    if not stat.S_ISDIR(st.st_mode):
        raise RuntimeDirError(f"runtime dir {path} exists and is not a directory")
    if st.st_uid != os.getuid():
        raise RuntimeDirError(f"runtime dir {path} is owned by uid {st.st_uid}, not by you "
                              f"(uid {os.getuid()}); pick another with --runtime-dir")
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise RuntimeDirError(f"runtime dir {path} is writable by others (mode "
                              f"{stat.S_IMODE(st.st_mode):04o}); run `chmod 700 {path}` or pick another")


def ensure(path: str | os.PathLike | None = None) -> RunDir:
    """Resolve (argument, $COLOCATE_RUNTIME_DIR, $XDG_RUNTIME_DIR/colocate,
    /tmp/colocate-$UID), create with mode 0700 and check it."""
    p = Path(path).expanduser() if path else default()
    p = p.absolute()
    try:
        p.mkdir(mode=0o700, parents=True, exist_ok=True)
    except OSError as e:
        raise RuntimeDirError(f"cannot create runtime dir {p}: {e.strerror}") from None
    check(p)
    rd = RunDir(p)
    if len(str(rd.sock).encode()) > _SUN_PATH_MAX:
        raise RuntimeDirError(f"runtime dir path too long for a unix socket ({rd.sock}); "
                              f"use a shorter --runtime-dir")
    return rd


def subdir(parent: Path, name: str) -> Path:
    """A private (0700) subdirectory."""
    d = parent / name
    d.mkdir(mode=0o700, exist_ok=True)
    return d

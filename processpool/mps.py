"""The MPS control daemon for the process pool (device cuda only).

    mps = Mps(rundir_path)
    print(mps.ensure())          # use a running daemon, or start ours; says which
    env = mps.env()              # CUDA_MPS_PIPE_DIRECTORY / CUDA_MPS_LOG_DIRECTORY for workers
    ...
    mps.stop()                   # `echo quit | nvidia-cuda-mps-control`, only if we started it

Ours lives under the runtime dir: DIR/mps/pipe and DIR/mps/log.  A daemon that
already answers (at the caller's $CUDA_MPS_PIPE_DIRECTORY, at ours, or at the
system default /tmp/nvidia-mps) is used as it is and left running.
`CUDA_MPS_ACTIVE_THREAD_PERCENTAGE` is read when a client creates its context,
which is why the pool has one worker process per quota.
"""
from __future__ import annotations

import logging
import os
import shutil
import subprocess
import time
from pathlib import Path

from shim.rundir import ColocateError

log = logging.getLogger("colocate.pool")

CONTROL = "nvidia-cuda-mps-control"
DEFAULT_PIPE = Path("/tmp/nvidia-mps")          # what clients use without CUDA_MPS_PIPE_DIRECTORY
DEFAULT_LOG = Path("/var/log/nvidia-mps")
PIPE_ENV, LOG_ENV = "CUDA_MPS_PIPE_DIRECTORY", "CUDA_MPS_LOG_DIRECTORY"


class MpsError(ColocateError):
    pass


def find_control() -> str:
    """Path of nvidia-cuda-mps-control on $PATH, or a clear MpsError."""
    exe = shutil.which(CONTROL)
    if exe is None:
        raise MpsError(f"{CONTROL} not found on PATH: the process pool needs the NVIDIA MPS control "
                       f"daemon on device cuda (it ships with the driver utilities); "
                       f"or run `colocate serve --pool none`")
    return exe


class Mps:
    def __init__(self, runtime_dir: str | os.PathLike, env: dict[str, str] | None = None,
                 start_timeout: float = 10.0):
        self.base = Path(runtime_dir) / "mps"
        self.own_pipe, self.own_log = self.base / "pipe", self.base / "log"
        self.caller_env = dict(os.environ if env is None else env)
        self.pipe_dir, self.log_dir = self.own_pipe, self.own_log
        self.started = False                      # True: we started it, so stop() quits it
        self.start_timeout = start_timeout

    # --- commands (pure: what we would run, with which environment)
    def env(self, pipe_dir: Path | None = None, log_dir: Path | None = None) -> dict[str, str]:
        """The MPS variables a client (worker) or a control command needs."""
        return {PIPE_ENV: str(pipe_dir or self.pipe_dir), LOG_ENV: str(log_dir or self.log_dir)}

    def start_cmd(self) -> list[str]:
        return [find_control(), "-d"]

    def control_cmd(self) -> list[str]:
        """The client form: commands (get_server_list, quit) go to its stdin."""
        return [find_control()]

    def _env_for(self, pipe_dir: Path, log_dir: Path) -> dict[str, str]:
        return {**self.caller_env, **self.env(pipe_dir, log_dir)}

    def query(self, command: str, pipe_dir: Path | None = None, log_dir: Path | None = None,
              timeout: float = 5.0) -> subprocess.CompletedProcess:
        """`echo COMMAND | nvidia-cuda-mps-control` against the daemon at pipe_dir."""
        pipe_dir, log_dir = pipe_dir or self.pipe_dir, log_dir or self.log_dir
        try:
            return subprocess.run(self.control_cmd(), input=command + "\n", capture_output=True, text=True,
                                  env=self._env_for(pipe_dir, log_dir), timeout=timeout)
        except subprocess.TimeoutExpired:
            return subprocess.CompletedProcess(self.control_cmd(), 124, "", f"timed out after {timeout:g} s")

    def answers(self, pipe_dir: Path, log_dir: Path) -> bool:
        """A control daemon listens at pipe_dir (its `control` pipe exists and get_server_list works)."""
        if not (pipe_dir / "control").exists():
            return False
        return self.query("get_server_list", pipe_dir, log_dir, timeout=5.0).returncode == 0

    def candidates(self) -> list[tuple[Path, Path]]:
        """Where a running daemon may already be: the caller's dirs, ours, the system default."""
        out = []
        if self.caller_env.get(PIPE_ENV):
            out.append((Path(self.caller_env[PIPE_ENV]), Path(self.caller_env.get(LOG_ENV) or DEFAULT_LOG)))
        out.append((self.own_pipe, self.own_log))
        out.append((DEFAULT_PIPE, Path(self.caller_env.get(LOG_ENV) or DEFAULT_LOG)))
        seen, uniq = set(), []
        for p, lg in out:
            if p not in seen:
                seen.add(p)
                uniq.append((p, lg))
        return uniq

    # --- lifecycle
    def ensure(self) -> str:
        """Use a daemon that answers, or start ours.  Returns (and logs) which."""
        find_control()                            # missing binary: say so before anything else
        for pipe, lg in self.candidates():
            if self.answers(pipe, lg):
                self.pipe_dir, self.log_dir, self.started = pipe, lg, False
                msg = f"using the running MPS control daemon (pipe dir {pipe})"
                log.info("%s", msg)
                return msg
        for d in (self.base, self.own_pipe, self.own_log):
            d.mkdir(mode=0o700, parents=True, exist_ok=True)
        self.pipe_dir, self.log_dir = self.own_pipe, self.own_log
        cmd = self.start_cmd()
        try:
            r = subprocess.run(cmd, capture_output=True, text=True, timeout=self.start_timeout,
                               env=self._env_for(self.own_pipe, self.own_log), stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired:
            raise MpsError(f"`{' '.join(cmd)}` did not return within {self.start_timeout:g} s") from None
        if r.returncode != 0:
            raise MpsError(f"`{' '.join(cmd)}` failed with code {r.returncode}: "
                           f"{(r.stderr or r.stdout).strip() or 'no output'}; see {self.own_log}/control.log")
        end = time.monotonic() + self.start_timeout
        while not self.answers(self.own_pipe, self.own_log):
            if time.monotonic() > end:
                raise MpsError(f"the MPS control daemon started but does not answer at {self.own_pipe} "
                               f"within {self.start_timeout:g} s; last lines of {self.own_log}/control.log:\n"
                               + self.log_tail())
            time.sleep(0.1)
        self.started = True
        msg = f"started the MPS control daemon (pipe dir {self.own_pipe}, log dir {self.own_log})"
        log.info("%s", msg)
        return msg

    def stop(self) -> None:
        """Quit the daemon if we started it; leave a borrowed one alone."""
        if not self.started:
            return
        self.started = False
        try:
            r = self.query("quit", self.own_pipe, self.own_log, timeout=10.0)
        except MpsError as e:                     # binary gone meanwhile
            log.error("cannot stop the MPS control daemon: %s", e)
            return
        if r.returncode != 0:
            log.error("`echo quit | %s` failed (code %d): %s", CONTROL, r.returncode,
                      (r.stderr or r.stdout).strip())
        else:
            log.info("stopped the MPS control daemon (pipe dir %s)", self.own_pipe)

    def log_tail(self, n: int = 10) -> str:
        try:
            return "\n".join((self.own_log / "control.log").read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return "(no control.log)"

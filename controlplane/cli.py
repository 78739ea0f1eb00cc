"""`colocate`: run a controller, run apps under it, look at what they get."""
from __future__ import annotations

import collections
import json
import os
import signal
import subprocess
import sys
import time
from enum import Enum
from pathlib import Path
from typing import Literal, Optional

import typer
from rich import box
from rich.console import Console
from rich.live import Live
from rich.table import Table
from rich.text import Text

from controlplane import client, protocol
from predictors.cli import app as predictors_app
from predictors.cli import profile as predictors_profile
from predictors.cli import traces as predictors_traces
from predictors.cli import train as predictors_train
from processpool import SPEC_HELP, parse_spec
from shim import launcher, rundir
from shim.ctlblock import is_partition
from shim.rundir import ColocateError

app = typer.Typer(help=__doc__, no_args_is_help=True, add_completion=False,
                  pretty_exceptions_enable=False)
out = Console(width=None if sys.stdout.isatty() else 200)   # pipes get whole rows


class Device(str, Enum):
    auto = "auto"
    sim = "sim"
    cuda = "cuda"


class RouteKind(str, Enum):
    auto = "auto"
    pool = "pool"
    part = "partition"       # (a member named partition would hide str.partition)


ROUTE_HELP = ("Where a quota below 100 % runs: pool (launches forwarded to an MPS worker of that "
              "quota), partition (an SM partition -- a green context -- inside the app: no worker, "
              "no shared memory; the quota is rounded to the device's partition size, see `colocate "
              "quotas`), auto (partition where the driver has green contexts, else pool).")


class Level(str, Enum):
    debug = "debug"
    info = "info"
    warning = "warning"
    error = "error"


RUNDIR_HELP = ("Runtime directory (socket, control block, logs). Default: $COLOCATE_RUNTIME_DIR, "
               "else $XDG_RUNTIME_DIR/colocate, else /tmp/colocate-$UID.")
RunDirOpt = typer.Option(None, "--runtime-dir", help=RUNDIR_HELP, metavar="DIR")
DEVICE_HELP = "auto: cuda when an NVIDIA driver answers, else sim (the CPU test device)."


# --- serve / stop / ping ----------------------------------------------------

@app.command()
def serve(device: Device = typer.Option(Device.auto, help=DEVICE_HELP),
          policy: str = typer.Option("static", metavar="NAME[,KEY=VALUE...]",
                                     help="Scheduling policy and its options: static, mps-even, "
                                          "mps-priority, baymax, static-optimal, claius (claius-nb, "
                                          "claius-nc: its ablations), e.g. claius,models=DIR,"
                                          "granularity=10 or static-optimal,profiles=DIR."),
          detach: bool = typer.Option(False, help="Run in the background; print its pid once it answers."),
          runtime_dir: Optional[Path] = RunDirOpt,
          log_level: Level = typer.Option(Level.info, help="Log level of serve.log."),
          pool: Optional[str] = typer.Option(None, metavar="SPEC", help=SPEC_HELP),
          route: RouteKind = typer.Option(RouteKind.pool, help=ROUTE_HELP),
          metrics_port: Optional[int] = typer.Option(None, min=1, max=65535, metavar="PORT",
                                                     help="Serve Prometheus metrics on "
                                                          "http://127.0.0.1:PORT/metrics."),
          solo: Optional[Path] = typer.Option(None, metavar="FILE",
                                              help="JSON {app name: launches per second alone at 100 %}: "
                                                   "batch throughput is shown normalised to it."),
          log_stderr: bool = typer.Option(True, hidden=True)) -> None:
    """Run the controller: applications register with it, the policy sets their GPU quotas.

    It also runs the process pool: worker processes at fixed SM quotas (MPS
    clients on cuda) that apps' launches can be routed to (`colocate pool`,
    `colocate set-quota`); worker logs are DIR/worker-N.log.  Without an
    explicit --pool, a pool that cannot start (worker not built) is skipped
    with a warning in the log.

    Logs to DIR/serve.log (and stderr in the foreground); SIGTERM, SIGINT or
    `colocate stop` shut it down cleanly."""
    # the controller's imports: serve's alone
    from controlplane import daemon

    parse_spec(pool)                                    # a bad spec: exit 2 before anything
    daemon.load_solo(solo)                              # and a bad --solo file
    rd = rundir.ensure(runtime_dir)
    dev = launcher.detect_device(device.value)
    if not detach:
        daemon.serve(rd, policy, dev, log_level.value, log_stderr, pool, metrics_port, solo,
                     route.value)
        return
    daemon.policy(policy)                               # unknown name: say so here, not in the log
    pong = client.ping(rd, timeout=0.5)
    if pong:
        raise ColocateError(f"a controller (pid {pong['controller_pid']}) already answers on {rd.sock}")
    proc, pong = client.start_background(rd, policy, dev, log_level.value, pool=pool,
                                         metrics_port=metrics_port, solo=solo, route=route.value)
    print(proc.pid)
    print(f"colocate: controller {proc.pid} serving {rd.sock} (policy {pong['policy']}, "
          f"device {pong['device']})", file=sys.stderr)


@app.command()
def stop(runtime_dir: Optional[Path] = RunDirOpt,
         timeout: float = typer.Option(10.0, help="Seconds to wait for it to exit.")) -> None:
    """Stop the controller (SIGTERM to the pid in serve.pid if it does not answer)."""
    rd = rundir.ensure(runtime_dir)
    pid = client.running_pid(rd)
    try:
        client.request(rd, "stop", timeout=1.0)
        pid = pid or client.running_pid(rd)
    except client.NoController:
        if pid is None:
            raise ColocateError(f"no controller is running in {rd.path}") from None
        print(f"colocate: controller {pid} does not answer; sending SIGTERM", file=sys.stderr)
        os.kill(pid, signal.SIGTERM)
    if pid and not client.wait_gone(pid, timeout):
        raise ColocateError(f"controller {pid} did not exit within {timeout:g} s")
    print(f"colocate: controller {pid} stopped" if pid else "colocate: controller stopped", file=sys.stderr)


@app.command()
def ping(runtime_dir: Optional[Path] = RunDirOpt,
         timeout: float = typer.Option(1.0, help="Seconds to wait for the answer.")) -> None:
    """Check that a controller answers; print its pid, policy, device and app count."""
    rd = rundir.ensure(runtime_dir)
    p = client.request(rd, "ping", timeout=timeout)
    print(f"controller {p['controller_pid']} (colocate {p['version']}): policy {p['policy']}, "
          f"device {p['device']}, {p['apps']} live app(s), {rd.sock}")


# --- run --------------------------------------------------------------------

@app.command(context_settings={"allow_interspersed_args": False})
def run(cmd: Optional[list[str]] = typer.Argument(None, metavar="-- CMD [ARGS]",
                                                  help="The program to run and its arguments."),
        name: Optional[str] = typer.Option(None, help="App name shown by `colocate quotas` "
                                                       "(default: CMD's basename)."),
        cls: str = typer.Option("batch", "--class", help="qos (latency-critical) or batch."),
        qos_ms: Optional[float] = typer.Option(None, "--qos-ms", help="Latency target in ms (qos only)."),
        quota: Optional[int] = typer.Option(None, help="Requested SM share in percent (1..100)."),
        device: Device = typer.Option(Device.auto, help=DEVICE_HELP + " auto asks the running controller first."),
        trace_file: Optional[Path] = typer.Option(None, "--trace", metavar="FILE",
                                                  help="Also write its per-task trace (JSON lines) to FILE; "
                                                       "see `colocate trace --help` for the fields."),
        runtime_dir: Optional[Path] = RunDirOpt) -> None:
    """Run CMD with the colocate shim preloaded; exit with its exit code (128+N if killed by signal N).

    Works without a controller too: the app then runs natively."""
    spec = launcher.AppSpec(list(cmd or []), name, cls, qos_ms, quota)
    launcher.check(spec)
    rd = rundir.ensure(runtime_dir)
    dev = run_device(device, rd)
    if trace_file is not None:
        trace_to(trace_file)
    raise typer.Exit(launcher.run(spec, rd, dev))


def run_device(device: Device, rd: rundir.RunDir) -> str:
    """The device to run on: as asked, or for auto the running controller's, else detected."""
    if device.value != "auto":
        return device.value
    pong = client.ping(rd, timeout=0.3) if rd.sock.exists() else None
    return pong["device"] if pong else launcher.detect_device("auto")


# --- trace ------------------------------------------------------------------

class TraceFormat(str, Enum):
    jsonl = "jsonl"
    csv = "csv"


# The CSV columns, in order (a JSON line's fields, with grid/block split and
# a library task's params flattened to "key=value;...").
TRACE_COLUMNS = ("pid", "app", "seq", "kind", "name", "grid_x", "grid_y", "grid_z", "block_x", "block_y",
                 "block_z", "shmem", "stream", "host_us", "start_us", "dur_us", "quota", "route", "worker",
                 "query", "kernels", "rc", "params", "id", "size", "rule", "latency_us")


def trace_to(path: Path) -> None:
    """Have the apps started from here trace into path (created empty now;
    the shim appends, one write per batch of lines)."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"")
    except OSError as e:
        raise ColocateError(f"cannot write the trace to {path}: {e.strerror}", 2) from None
    os.environ["COLOCATE_TRACE"] = str(path.resolve())


def read_trace(path: Path) -> tuple[list[dict], int]:
    """The trace's JSON objects, and how many lines were not one (an app
    killed while writing can leave half a line)."""
    rows, bad = [], 0
    try:
        text = path.read_text(errors="replace")
    except FileNotFoundError:
        return [], 0
    for line in text.splitlines():
        try:
            obj = json.loads(line)
        except ValueError:
            bad += 1
            continue
        if isinstance(obj, dict):
            rows.append(obj)
        else:
            bad += 1
    return rows, bad


def csv_row(rec: dict) -> dict:
    row = {k: rec.get(k) for k in TRACE_COLUMNS}
    for dim in ("grid", "block"):
        v = rec.get(dim) or [None, None, None]
        row.update({f"{dim}_{axis}": x for axis, x in zip("xyz", v)})
    params = rec.get("params")
    row["params"] = ";".join(f"{k}={v}" for k, v in params.items()) if isinstance(params, dict) else None
    return {k: "" if v is None else v for k, v in row.items()}


def write_csv(rows: list[dict], path: Path) -> None:
    import csv
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=TRACE_COLUMNS, extrasaction="ignore")
        w.writeheader()
        for rec in sorted(rows, key=lambda r: (r.get("pid") or 0, r.get("seq") or 0)):
            w.writerow(csv_row(rec))


@app.command(context_settings={"allow_interspersed_args": True})
def trace(name: str = typer.Argument(..., help="App name (as `colocate quotas` shows it)."),
          cmd: Optional[list[str]] = typer.Argument(None, metavar="-- CMD [ARGS]",
                                                    help="The program to run and its arguments (after --)."),
          out_file: Optional[Path] = typer.Option(None, "--out", metavar="FILE",
                                                  help="Where to write it (default: NAME.trace.jsonl / .csv)."),
          fmt: TraceFormat = typer.Option(TraceFormat.jsonl, "--format",
                                          help="JSON lines, or CSV converted from them."),
          cls: str = typer.Option("batch", "--class", help="qos (latency-critical) or batch."),
          qos_ms: Optional[float] = typer.Option(None, "--qos-ms", help="Latency target in ms (qos only)."),
          quota: Optional[int] = typer.Option(None, help="Requested SM share in percent (1..100)."),
          device: Device = typer.Option(Device.auto, help=DEVICE_HELP + " auto asks the running controller first."),
          runtime_dir: Optional[Path] = RunDirOpt) -> None:
    """Run CMD like `colocate run`, recording every task it runs; exit with its exit code.

    A task is a kernel launch, or one cuDNN/cuBLAS call with the kernels it
    launched.  One line per task, plus one per query boundary, from every
    process of CMD.  Times in microseconds: host_us is the host's monotonic
    clock when issued; start_us/dur_us are device time from two events on the
    task's stream (modelled on simgpu, measured on a GPU; for a task routed
    to a pool worker, the worker's events), start relative to the process's
    first task; empty when unknown (events unavailable, the worker lost,
    unfinished at exit).

    Columns: pid, app (NAME), seq (order within pid), kind (kernel, library,
    query_begin, query_end), name (mangled kernel or API name),
    grid_x..z, block_x..z, shmem (dynamic shared bytes), stream, host_us,
    start_us, dur_us, quota (SM % it ran at), route (local or worker),
    worker (its id), query (the query it belongs to), kernels (a library
    task's kernel count), rc (its status), params (its parameters,
    key=value;...), id, size, rule (api or inferred), latency_us (query
    boundaries: the query's id, input size, how it was found, host latency).
    JSON lines have the same fields, grid and block as 3-element lists and params as an
    object."""
    spec = launcher.AppSpec(list(cmd or []), name, cls, qos_ms, quota)
    launcher.check(spec)
    rd = rundir.ensure(runtime_dir)
    dev = run_device(device, rd)
    dest = out_file or Path(f"{name}.trace.{fmt.value}")
    raw = dest if fmt is TraceFormat.jsonl else dest.with_name(dest.name + ".jsonl.part")
    trace_to(raw)
    code = launcher.run(spec, rd, dev)
    rows, bad = read_trace(raw)
    if fmt is TraceFormat.csv:
        try:
            write_csv(rows, dest)
        except OSError as e:
            raise ColocateError(f"cannot write {dest}: {e.strerror} (the JSON lines are in {raw})") from None
        raw.unlink(missing_ok=True)
    kinds = collections.Counter(r.get("kind") for r in rows)
    print(f"colocate: trace of {name}: {kinds['kernel'] + kinds['library']} task(s) ({kinds['kernel']} kernel, "
          f"{kinds['library']} library), {kinds['query_end']} query(ies) ended -> {dest}"
          + (f" ({bad} unreadable line(s) skipped)" if bad else ""), file=sys.stderr)
    raise typer.Exit(code)


# --- quotas -----------------------------------------------------------------

QUOTA_KEYS = ("name", "pid", "class", "quota_pct", "route", "launches", "forwarded",
              "h2d_bytes", "d2h_bytes", "qos_ms", "state", "kernels", "queries", "held", "held_ms",
              "throughput", "feed", "end", "partition")


def human_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            break
        n /= 1024
    return f"{n} B" if unit == "B" else f"{n:.1f} {unit}"


def route_name(route: int, worker: dict | None = None, quota_pct: int | None = None,
               held: bool = False, partition: dict | None = None) -> str:
    """"local", "held", "worker N (q%)" with the worker's quota when known, or
    "partition 64/132 SMs" (the SMs the app's shim got for its quota)."""
    if held:
        return "held"
    if route == 0:
        return "local"
    if is_partition(route):
        if not partition or not partition.get("total"):
            return f"partition ({route & 0xFF}% from {route >> 8 & 0xFF}%)"
        if not partition["sms"]:
            return "partition failed: all SMs"
        # launches that ran on all SMs meanwhile: graphs, cooperative kernels
        rest = f", {partition['local']} on all" if partition.get("local") else ""
        first = partition.get("first", 0)
        return (f"partition {partition['sms']}/{partition['total']} SMs "
                f"({first}-{first + partition['sms'] - 1}{rest})")
    q = (worker or {}).get("quota_pct", quota_pct)
    return f"worker {route}" + ("" if q is None else f" ({q}%)")


def query_cells(q: dict | None) -> list[str]:
    """queries (done, +in flight), p50/p99 latency, rule: "-" before any query."""
    if not q or q.get("rule") is None:
        return ["-", "-", "-"]
    done = str(q["done"]) + (f" +{q['in_flight']}" if q["in_flight"] else "")
    if q.get("violations"):
        done += f" ({q['violations']} late)"
    lat = "-" if q["p50_ms"] is None else f"{q['p50_ms']:.2f}/{q['p99_ms']:.2f} ms"
    return [done, lat, q["rule"]]


def throughput_cell(a: dict) -> str:
    """A batch app's throughput: normalised to solo ("0.62x") when known, else launches/s."""
    t = a.get("throughput")
    if not t or t.get("launches_per_s") is None:
        return "-"
    if t.get("normalised") is not None:
        return f"{t['normalised']:.2f}x"
    return f"{t['launches_per_s']:.0f}/s"


def quota_table(apps: list[dict], show_state: bool = False) -> Table:
    live = sum(a["state"] == "live" for a in apps)
    t = Table(title=f"colocate: {live} live app(s)", box=box.SIMPLE_HEAD,
              pad_edge=False, collapse_padding=True)
    cols = ["name", "pid", "class", "quota%", "route", "launches", "fwd", "H2D", "D2H", "QoS",
            "queries", "p50/p99", "rule", "thru", "held"]
    for c in cols + (["state"] if show_state else []):
        t.add_column(c, justify="left" if c in ("name", "class", "route", "state", "rule") else "right",
                     no_wrap=c != "name", overflow="fold")
    for a in apps:
        row = [a["name"], str(a["pid"]), a["class"], str(a["quota_pct"]),
               route_name(a["route"], a.get("worker"), a["quota_pct"], bool(a.get("held")),
                          a.get("partition")),
               str(a["launches"]), str(a["forwarded"]), human_bytes(a["h2d_bytes"]),
               human_bytes(a["d2h_bytes"]), "-" if a["qos_ms"] is None else f"{a['qos_ms']:g} ms",
               *query_cells(a.get("queries")), throughput_cell(a),
               f"{a['held_ms'] / 1000:.1f} s" if a.get("held_ms") else "-"]
        # an exited app says how it ended when that was not a normal exit
        state = a["state"] if a.get("end") in (None, "exited") else f"{a['state']} ({a['end']})"
        t.add_row(*(Text(c) for c in row), *([state] if show_state else []))
    return t


@app.command()
def quotas(as_json: bool = typer.Option(False, "--json", help="Print a JSON list (raw integers)."),
           watch: bool = typer.Option(False, help="Refresh until Ctrl-C."),
           interval: float = typer.Option(1.0, help="Seconds between refreshes with --watch."),
           all_: bool = typer.Option(False, "--all", help="Also list exited apps (final records)."),
           runtime_dir: Optional[Path] = RunDirOpt) -> None:
    """Show each app's quota, route and counters (launches, forwarded, bytes copied) and its queries.

    queries: completed (+ in flight) (and how many ended after the app's QoS
    target); p50/p99: latency over the last 1000;
    rule: api (marked with colocate.h / shim.query) or inferred (from copies:
    host-to-device input ... device-to-host result and a sync);
    thru: a batch app's throughput over the last 5 s, normalised to its solo
    rate (serve --solo) as "0.62x", else launches/s; held: time its launches
    waited on a hold (route "held": the policy parked it)."""
    if watch and as_json:
        raise ColocateError("--watch and --json do not go together", 2)
    if interval <= 0:
        raise ColocateError("--interval must be > 0", 2)
    rd = rundir.ensure(runtime_dir)

    def fetch() -> list[dict]:
        return client.request(rd, "list", timeout=1.0, all=all_)["apps"]
    if as_json:
        print(json.dumps([{k: a[k] for k in QUOTA_KEYS} for a in fetch()], indent=2))
    elif not watch:
        out.print(quota_table(fetch(), all_))
    elif not out.is_terminal:                          # a pipe: one table per refresh
        try:
            while True:
                out.print(quota_table(fetch(), all_))
                sys.stdout.flush()
                time.sleep(interval)
        except KeyboardInterrupt:
            pass
    else:
        try:
            with Live(quota_table(fetch(), all_), console=out, auto_refresh=False) as live:
                while True:
                    time.sleep(interval)
                    live.update(quota_table(fetch(), all_), refresh=True)
        except KeyboardInterrupt:
            pass


@app.command()
def kernels(name: Optional[str] = typer.Argument(None, help="Only this app."),
            as_json: bool = typer.Option(False, "--json", help="Print a JSON list."),
            no_twin: bool = typer.Option(False, "--no-twin",
                                         help="Only kernels that ran on simgpu without a host twin."),
            runtime_dir: Optional[Path] = RunDirOpt) -> None:
    """Kernels each exited app launched, by device name, and whether simgpu had a host twin.

    A kernel without a twin was timed by simgpu's device model but computed
    nothing: write one (shim/simgpu/simgpu_twin.h) for results to be right."""
    apps = client.request(rundir.ensure(runtime_dir), "list", timeout=1.0, all=True)["apps"]
    rows = [{"app": a["name"], "pid": a["pid"], **k} for a in apps
            if name in (None, a["name"]) for k in a.get("kernels") or []
            if not no_twin or k.get("twin") is False]
    if as_json:
        print(json.dumps(rows, indent=2))
        return
    t = Table(box=box.SIMPLE_HEAD, title=f"colocate: {len(rows)} kernel(s)")
    cols: tuple[tuple[str, Literal["left", "right"]], ...] = (
        ("app", "left"), ("pid", "right"), ("kernel", "left"), ("launches", "right"), ("twin", "left"))
    for col, j in cols:
        t.add_column(col, justify=j)
    for r in rows:
        twins: dict[bool | None, str | Text] = {True: "yes", False: Text("no", style="bold red"), None: "-"}
        twin = twins[r.get("twin")]
        t.add_row(r["app"], str(r["pid"]), r["name"], str(r["launches"]), twin)
    out.print(t)


# --- process pool -------------------------------------------------------------

POOL_KEYS = ("id", "quota_pct", "pid", "state", "forwarded", "apps", "modules", "module_loads",
             "refused_kernels", "translated")


def pool_table(reply: dict) -> Table:
    workers = reply["workers"]
    ready = sum(w["state"] == "ready" for w in workers)
    t = Table(title=f"colocate: process pool {reply.get('spec', '?')}: {ready}/{len(workers)} ready",
              box=box.SIMPLE_HEAD, pad_edge=False, collapse_padding=True)
    for c in ("id", "quota %", "pid", "state", "forwarded", "apps", "routed", "modules"):
        t.add_column(c, justify="left" if c == "state" else "right", no_wrap=True)
    for w in workers:
        style = {"ready": "", "starting": "yellow", "unresponsive": "yellow"}.get(w["state"], "bold red")
        t.add_row(str(w["id"]), str(w["quota_pct"]), "-" if w["pid"] is None else str(w["pid"]),
                  Text(w["state"], style=style), str(w["forwarded"]), str(w["apps"]),
                  str(w.get("routed", "-")), str(w.get("modules", "-")))
    return t


@app.command("metrics")
def metrics_cmd(runtime_dir: Optional[Path] = RunDirOpt) -> None:
    """Print the controller's per-app metrics in Prometheus text format.

    Quota, route, launches, bytes copied, queries, QoS violations and recent
    query latency (p50, p99) of every live app; the same metrics as
    `colocate serve --metrics-port PORT` serves over HTTP."""
    from controlplane import metrics
    rd = rundir.ensure(runtime_dir)
    apps = client.request(rd, "list", timeout=1.0, all=False)["apps"]
    sys.stdout.write(metrics.exposition(apps))


@app.command("pool")
def pool_cmd(as_json: bool = typer.Option(False, "--json", help="Print a JSON list of workers."),
             runtime_dir: Optional[Path] = RunDirOpt) -> None:
    """Show the process pool's workers: id, SM quota, pid, state, tasks forwarded, apps,
    and the apps' fat binaries each holds loaded (modules; module_loads counts every load).
    --json adds refused_kernels (kernels a worker could not serve: they ran in their apps) and
    translated (launches whose pointers a worker moved, because it could not map the app's
    memory at the app's address).

    States: starting, ready, unresponsive (did not answer in time), dead (to be
    restarted under a new id), failed (kept dying; not restarted)."""
    reply = client.request(rundir.ensure(runtime_dir), "pool", timeout=2.0)
    if as_json:
        print(json.dumps([{k: w.get(k) for k in (*POOL_KEYS, "routed") if k in w} for w in reply["workers"]],
                         indent=2))
        return
    if not reply["workers"]:
        print(f"colocate: no process pool ({reply.get('note') or 'spec ' + str(reply.get('spec'))})",
              file=sys.stderr)
        return
    out.print(pool_table(reply))


@app.command("set-quota")
def set_quota(name: str = typer.Argument(..., help="App name (as `colocate quotas` shows it); "
                                                   "every live app of that name."),
              pct: int = typer.Argument(..., metavar="PCT", help="SM share in percent, 1..100."),
              runtime_dir: Optional[Path] = RunDirOpt) -> None:
    """Give an app PCT % of the SMs: a ready pool worker whose quota is exactly PCT,
    or, under `serve --route partition`, an SM partition of about PCT % in the app.

    PCT 100 without a 100 % worker runs the app locally.  Fails when the pool
    has no ready worker at that quota (see `colocate pool`)."""
    if not 1 <= pct <= 100:
        raise ColocateError(f"PCT must be 1..100 (got {pct})", 2)
    r = client.request(rundir.ensure(runtime_dir), "set_quota", timeout=2.0, name=name, quota_pct=pct)
    for slot, route in zip(r.get("slots") or [r["slot"]], r.get("routes") or [r["route"]]):
        print(f"colocate: {name} (slot {slot}): {pct}%, {route_name(route, None, pct)}", file=sys.stderr)


# --- schema / demo ----------------------------------------------------------

def _notes(f: protocol.Field) -> str:
    notes = [f.bounds()] if f.bounds() else []
    if not f.required and f.default not in (None, [], ""):
        notes.append(f"default {json.dumps(f.default)}")
    return "; ".join(notes + ([f.doc] if f.doc else []))


@app.command("schema")
def schema_cmd(as_json: bool = typer.Option(False, "--json", help="Print it as JSON.")) -> None:
    """Print the controller protocol (message types and their fields)."""
    if as_json:
        print(json.dumps(protocol.as_json(), indent=2))
        return
    out.print(f'protocol v{protocol.PROTOCOL} (revision {protocol.REVISION}): DEALER -> ROUTER at '
              f'ipc://DIR/ctl.sock, frames [b"", JSON object] of at most {protocol.MAX_BYTES} bytes; '
              f'every message has "v": {protocol.PROTOCOL} and "type".',
              markup=False)
    for title, table in (("requests (-> reply)", protocol.REQUESTS), ("replies", protocol.REPLIES),
                         ("objects", {"kernel": protocol.KERNEL, "record": protocol.RECORD,
                                      "worker": protocol.WORKER, "queries": protocol.QUERIES,
                                      "task": protocol.TASK, "feed": protocol.FEED,
                                      "throughput": protocol.THROUGHPUT})):
        t = Table(title=title)
        for c in ("message", "field", "type", "required", "notes"):
            t.add_column(c)
        for name, fields in table.items():
            label = name
            if table is protocol.REQUESTS and name in protocol.REPLY_TO:
                label += f" -> {protocol.REPLY_TO[name]}" if protocol.REPLY_TO[name] else " (one-way)"
            rows = [(f, spec.describe(), "yes" if spec.required else "no", _notes(spec))
                    for f, spec in fields.items()] or [("-", "", "", "")]
            for i, row in enumerate(rows):
                t.add_row(*(Text(c) for c in (label if i == 0 else "", *row)))
            t.add_section()
        out.print(t)


@app.command()
def demo(device: Device = typer.Option(Device.auto, help=DEVICE_HELP),
         keep: bool = typer.Option(False, help="Keep the demo's runtime dir (logs, history, report)."),
         basic: bool = typer.Option(False, help="The two-app run (hotspot + vecadd at 100 %%) even on simgpu.")
         ) -> None:
    """Co-location under claius and two baselines, live: on simgpu a Tonic service (pos, 80 ms QoS
    target) with hotspot and lud under claius, mps-priority and baymax, 8 s each, printing p99 against
    the target, violations and batch throughput, and writing bench/out/demo.png (about a minute).
    On a GPU (or with --basic): hotspot (batch) and vecadd (QoS, 50 ms) together, and what each got."""
    from controlplane import demo as demo_mod
    raise typer.Exit(demo_mod.main(device.value, keep, basic=basic))


@app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True,
                               "help_option_names": []})
def experiment(ctx: typer.Context) -> None:
    """C-Laius's experiments in the simulator (claius-pairs, claius-ablation, ...):
    `colocate experiment --help` lists them and their options.  Needs a source
    checkout (the experiments and the simulator live in bench/)."""
    script = Path(__file__).resolve().parent.parent / "bench" / "experiments.py"
    if not script.exists():
        raise ColocateError(f"{script} is missing: experiments run from a source checkout of colocate")
    raise typer.Exit(subprocess.call([sys.executable, str(script), *ctx.args]))


# --- pipeline ---------------------------------------------------------------

pipeline_app = typer.Typer(help="Camelot's microservice pipelines, live: `run SPEC`, `plan SPEC`, `ls` "
                                "(the default).",
                           invoke_without_command=True, add_completion=False)


@pipeline_app.callback()
def pipeline_main(ctx: typer.Context,
                  as_json: bool = typer.Option(False, "--json", help="Alone: as `ls --json`."),
                  runtime_dir: Optional[Path] = RunDirOpt) -> None:
    """Camelot's microservice pipelines, live: `colocate pipeline run SPEC` runs one
    (bench/camelot/specs/ has examples), `colocate pipeline plan SPEC` sizes its stages
    (profile, per-stage models, allocator); `colocate pipeline` alone lists the running ones."""
    if ctx.invoked_subcommand is None:
        pipeline_ls(as_json=as_json, runtime_dir=runtime_dir)


def _ms(v: float | None, digits: int = 1) -> str:
    return "-" if v is None else f"{v:.{digits}f}"


def _p50_99(d: dict) -> str:
    return "-" if d.get("p50") is None else f"{d['p50']:.1f}/{d['p99']:.1f}"


def pipeline_tables(rep: dict) -> list[Table]:
    """The report of a run: one row per stage and end to end, one per hop between stages."""
    e2e = rep["e2e_ms"]
    t = Table(title=f"pipeline {rep['pipeline']} ({rep['mode']}, {rep['device']}, scale {rep['scale']:g}): "
                    f"{rep['queries']} queries at {rep['rate_qps']:g}/s, batch {rep['batch']}, "
                    f"QoS {rep['qos_ms']:g} ms", box=box.SIMPLE_HEAD)
    for c in ("stage", "inst", "quota%", "batches", "mean batch", "wait p50/p99 ms", "service p50/p99 ms",
              "in ms", "work ms", "out ms"):
        t.add_column(c, justify="left" if c == "stage" else "right")
    for s in rep["stages"]:
        t.add_row(f"{s['stage']} {s['kind']}", str(s["instances"]), str(s["quota"]), str(s["batches"]),
                  _ms(s["mean_batch"]), _p50_99(s["wait_ms"]), _p50_99(s["service_ms"]),
                  _ms(s["in_ms"], 2), _ms(s["work_ms"], 2), _ms(s["out_ms"], 2))
    t.add_section()
    thru = "-" if rep["throughput_qps"] is None else f"{rep['throughput_qps']:.1f} q/s"
    t.add_row("end to end", "", "", "", "", f"{e2e['violations']} late", _p50_99(e2e), "", thru, "")
    h = Table(title="hand-over between stages, per buffer (producer's export or D2H + transport + "
                    "consumer's open or H2D)", box=box.SIMPLE_HEAD)
    for c in ("hop", "buffers", "hand-offs", "copies", "mean bytes", "p50 ms", "p99 ms", "producer",
              "transport", "consumer"):
        h.add_column(c, justify="left" if c == "hop" else "right")
    for hop in rep["hops"]:
        parts = hop["parts_ms_p50"]
        h.add_row(f"{hop['from']} -> {hop['to']}", str(hop["buffers"]), str(hop["handoffs"]), str(hop["copies"]),
                  human_bytes(hop["bytes_mean"] or 0), _ms(hop["ms"]["p50"], 3), _ms(hop["ms"]["p99"], 3),
                  _ms(parts["producer"], 3), _ms(parts["transport"], 3), _ms(parts["consumer"], 3))
    return [t, h]


@pipeline_app.command("run")
def pipeline_run(spec: Path = typer.Argument(..., metavar="SPEC", help="The pipeline (TOML): name, qos_ms, "
                                                                       "batch, [[stage]] kind/instances/quota."),
                 copy: bool = typer.Option(False, "--copy", help="Hand each stage's output to the next "
                                           "through the host (D2H, bytes, H2D) instead of by handle."),
                 rate: float = typer.Option(20.0, help="Queries per second (Poisson arrivals)."),
                 queries: int = typer.Option(100, help="Queries to send."),
                 scale: Optional[float] = typer.Option(None, help="Work per query x the suite's (default: "
                                                       "SPEC's scale, else 0.01 on sim, 1 on cuda)."),
                 seed: int = typer.Option(1, help="Seed of the arrivals."),
                 json_file: Optional[Path] = typer.Option(None, "--json", metavar="FILE",
                                                          help="Also write the report as JSON to FILE."),
                 device: Device = typer.Option(Device.auto, help=DEVICE_HELP),
                 stage_timeout: float = typer.Option(60.0, help="Seconds a stage may take on one batch."),
                 runtime_dir: Optional[Path] = RunDirOpt) -> None:
    """Run a Camelot pipeline live (§V-B, §VI): each stage instance under the shim at its quota,
    queries batched and sent through, outputs handed on by handle (or --copy); print per-stage
    and end-to-end p50/p99, throughput and the hand-over time per buffer.

    Exit 2 for a bad SPEC, 1 when a stage fails (the others are stopped), 130 on Ctrl-C."""
    from controlplane import pipeline as pl
    if scale is not None and not scale > 0:
        raise ColocateError(f"--scale must be > 0 (got {scale:g})", 2)
    s = pl.load_spec(spec)
    rd = rundir.ensure(runtime_dir)
    dev = run_device(device, rd)
    plan = ", ".join(f"{st.kind} x{st.instances} @{st.quota}%" for st in s.stages)
    print(f"colocate: pipeline {s.name} ({plan}) on {dev}, "
          f"{'copies' if copy else 'handles'}: {queries} queries at {rate:g}/s", file=sys.stderr)
    rep = pl.run(s, rd, dev, pl.Options(copy=copy, rate=rate, queries=queries, scale=scale, seed=seed,
                                        stage_timeout_s=stage_timeout))
    for table in pipeline_tables(rep):
        out.print(table)
    if json_file is not None:
        try:
            json_file.write_text(json.dumps(rep, indent=1) + "\n")
        except OSError as e:
            raise ColocateError(f"cannot write {json_file}: {e.strerror}") from None


@pipeline_app.command("plan")
def pipeline_plan(spec: Path = typer.Argument(..., metavar="SPEC", help="A pipeline of Table I stages (TOML); "
                                                                        "its instances and quotas are replaced."),
                  allocator: str = typer.Option("camelot", help="camelot (Eq. 1; with --load Eq. 2-3), "
                                                "camelot-nc, camelot-aff, ea or laius."),
                  gpus: int = typer.Option(1, help="GPUs to plan for."),
                  load: Optional[float] = typer.Option(None, help="Queries per second to carry with the "
                                                       "least resources (Eq. 3) instead of the peak (Eq. 1)."),
                  gpu_model: str = typer.Option("h100", help="The GPU's constants for the constraints "
                                                "(h100, v100, 2080ti; simgpu is an H100)."),
                  quotas: str = typer.Option(",".join(map(str, range(10, 101, 10))),
                                             help="SM quotas to profile each stage at, comma-separated."),
                  scale: Optional[float] = typer.Option(None, help="The run's work scale (default: SPEC's, "
                                                        "else 0.01 on sim, 1 on cuda): the networks' width."),
                  write_to: Optional[Path] = typer.Option(None, "--write", metavar="FILE",
                                                          help="Write the planned SPEC (TOML) to FILE."),
                  as_json: bool = typer.Option(False, "--json", help="Print the plan as JSON."),
                  store: Optional[Path] = typer.Option(None, help="Sample store (default: colocate profile's)."),
                  device: Device = typer.Option(Device.auto, help=DEVICE_HELP),
                  runtime_dir: Optional[Path] = RunDirOpt) -> None:
    """Plan a pipeline as Camelot does (§VII): profile each stage alone at each quota and
    batch (`colocate profile`, resumable), fit its per-stage model (DT, Fig. 12), solve the
    allocation (instances, SM quotas, GPUs), and print it; --write FILE saves the SPEC that
    `colocate pipeline run` runs.  Exit 2 for a bad SPEC or option, 1 when no allocation fits."""
    from controlplane import pipeline as pl
    from controlplane import pipeline_plan as pp
    from predictors import profile as P
    from predictors import profile_gpu
    try:
        qs = P.parse_quotas(quotas)
    except ValueError as e:
        raise ColocateError(str(e), 2) from None
    if scale is not None and not scale > 0:
        raise ColocateError(f"--scale must be > 0 (got {scale:g})", 2)
    s = pl.load_spec(spec)
    dev = run_device(device, rundir.ensure(runtime_dir))
    st = profile_gpu.profile_store(store)
    p = pp.plan(s, dev, st, allocator, gpus, load, gpu_model, qs, scale, progress=out.is_terminal,
                log=lambda m: print(f"colocate: {m}", file=sys.stderr))
    a = p.allocation
    if as_json:
        print(json.dumps({"pipeline": s.name, "allocator": allocator, "gpus": gpus, "gpu": p.gpu.name,
                          "load_qps": load, "qos_ms": s.qos_ms, "planned_for_ms": p.qos_s * 1e3,
                          "width": p.width, "predicted_qps": a.throughput_qps, "latency_ms": a.latency_s * 1e3,
                          "resources_pct": a.resources_pct, "gpus_used": a.gpus,
                          "stages": [{"kind": x.kind, "instances": x.instances, "quota": x.quota,
                                      "devices": list(x.devices), "profile": p.labels[x.kind]}
                                     for x in p.spec.stages]}, indent=1))
    else:
        t = Table(title=f"plan {s.name}: {allocator} on {gpus} x {p.gpu.name}"
                        + (f" for {load:g} q/s" if load else " at peak")
                        + f", batch {s.batch}, planned for {p.qos_s * 1e3:.1f} ms", box=box.SIMPLE_HEAD)
        for c in ("stage", "instances", "quota%", "devices", "batch ms (predicted)", "stage q/s (predicted)"):
            t.add_column(c, justify="left" if c in ("stage", "devices") else "right")
        for x, m in zip(p.spec.stages, p.stages):
            d = m.duration_s(x.quota, s.batch)
            t.add_row(x.kind, str(x.instances), str(x.quota), ",".join(map(str, x.devices)),
                      f"{d * 1e3:.3f}", f"{x.instances * s.batch / d:.1f}")
        t.add_section()
        t.add_row("pipeline", "", f"{a.resources_pct}", f"{a.gpus} GPU(s)", f"{a.latency_s * 1e3:.3f}",
                  f"{a.throughput_qps:.1f}")
        out.print(t)
    if write_to is not None:
        pp.write(p, write_to)
        print(f"colocate: wrote {write_to}: colocate pipeline run {write_to}", file=sys.stderr)


def pipeline_ls_table(states: list[dict]) -> Table:
    t = Table(title=f"colocate: {len(states)} running pipeline(s)", box=box.SIMPLE_HEAD)
    for c in ("pipeline", "pid", "mode", "stage", "quota%", "instances (pid)", "batches", "queries",
              "p50/p99 ms", "QoS"):
        t.add_column(c, justify="left" if c in ("pipeline", "mode", "stage", "instances (pid)") else "right")
    for p in states:
        for k, st in enumerate(p["stages"]):
            first = k == 0
            lat = "-" if p.get("p99_ms") is None else f"{p['p50_ms']:.1f}/{p['p99_ms']:.1f}"
            t.add_row(p["name"] if first else "", str(p["pid"]) if first else "", p["mode"] if first else "",
                      f"{k + 1} {st['kind']}", str(st["quota"]),
                      " ".join(f"{i['name']}({i['pid']})" for i in st["instances"]),
                      str(sum(i["batches"] for i in st["instances"])),
                      f"{p['queries_done']}/{p['queries_total']}" if first else "",
                      lat if first else "", f"{p['qos_ms']:g} ms" if first else "")
        t.add_section()
    return t


@pipeline_app.command("ls")
def pipeline_ls(as_json: bool = typer.Option(False, "--json", help="Print a JSON list of the pipelines' states."),
                runtime_dir: Optional[Path] = RunDirOpt) -> None:
    """The running pipelines: stages, instances and their pids, quotas, queries done, p50/p99
    (each runner updates its state every second; those of runners gone are removed)."""
    from controlplane import pipeline as pl
    rd = rundir.ensure(runtime_dir)
    states = list(pl.running(rd))
    if as_json:
        print(json.dumps(states))
        return
    out.print(pipeline_ls_table(states))


app.add_typer(pipeline_app, name="pipeline")

# the predictors' commands live with the predictors
app.add_typer(predictors_app, name="predictors",
              help="Predictors: sample schema, synthetic samples, train, report.")
app.command("profile")(predictors_profile)
app.command("train")(predictors_train)
app.command("traces")(predictors_traces)


def main() -> None:
    try:
        app()
    except ColocateError as e:
        print(f"colocate: {e}", file=sys.stderr)
        sys.exit(e.code)


if __name__ == "__main__":
    main()

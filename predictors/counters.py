"""Hardware counters from Nsight Compute's CSV: text -> one row per kernel.

`ncu --csv` (the default "details" page) prints one line per kernel and
metric, under a header such as

    "ID","Process ID","Process Name","Host Name","Kernel Name","Context",
    "Stream","Block Size","Grid Size","Device","CC","Section Name",
    "Metric Name","Metric Unit","Metric Value"

(Nsight Compute CLI user guide, docs.nvidia.com/nsight-compute/NsightComputeCli,
"Output Pages" and the --csv / --print-units / --print-kernel-base options).
Columns are found by name, so extra or reordered columns do not matter.  A
value may carry thousands separators ("1,234.5"); units are scaled unless
--print-units base ("Gbyte/second", "usecond"), so every value is converted
to its base unit here: bytes/second, seconds, instructions per cycle.
ncu's own messages ("==PROF== ...", "==WARNING== ...") are skipped wherever
they are; lines before the header (a program's output) are skipped; any
other line after the header that is not a well-formed row is an error.

IDs number the profiled kernels in launch order, so rows come back sorted by
ID: the order the trace's tasks must be joined in.
"""
from __future__ import annotations

import csv
import io
from dataclasses import dataclass, field

NEED = ("ID", "Process ID", "Kernel Name", "Metric Name", "Metric Unit", "Metric Value")

# SI prefixes as ncu prints them (Kbyte, Mbyte, Gbyte; nsecond, usecond, msecond)
PREFIX = {"": 1.0, "K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15,
          "n": 1e-9, "u": 1e-6, "m": 1e-3}
BASES = ("byte", "second", "inst", "cycle", "warp", "thread", "sector", "request", "hz", "Hz")


class CountersError(Exception):
    """The text is not ncu CSV we can read; the message names the line."""


@dataclass
class KernelRow:
    id: int
    pid: int
    name: str
    metrics: dict[str, float] = field(default_factory=dict)   # base units


def unit_factor(unit: str) -> float:
    """What a value in `unit` is multiplied by to be in base units
    ("Gbyte/second" -> 1e9, "usecond" -> 1e-6, "inst/cycle" -> 1)."""
    u = unit.strip()
    if u in ("", "%", "/"):
        return 1.0
    num, _, den = u.partition("/")
    f = _part(num, unit)
    if den:
        f /= _part(den, unit)
    return f


def _part(p: str, unit: str) -> float:
    for b in BASES:
        if p.endswith(b) and p[:-len(b)] in PREFIX:
            return PREFIX[p[:-len(b)]]
    raise CountersError(f"unknown unit {unit!r}")


def number(text: str) -> float | None:
    """A metric value: thousands separators dropped; None for n/a."""
    t = text.strip().replace(",", "")
    if t.lower() in ("n/a", "", "-"):
        return None
    try:
        return float(t)
    except ValueError:
        raise CountersError(f"metric value {text!r} is not a number") from None


def parse(text: str) -> list[KernelRow]:
    """Per-kernel rows of `ncu --csv` output, in launch (ID) order."""
    rows: dict[int, KernelRow] = {}
    col: dict[str, int] | None = None
    ncols = 0
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip() or line.startswith("=="):
            continue
        try:
            fields = next(csv.reader(io.StringIO(line)))
        except (csv.Error, StopIteration) as e:
            if col is None:
                continue
            raise CountersError(f"ncu CSV line {n}: {e}: {line[:80]!r}") from None
        if col is None:
            if all(c in fields for c in NEED):
                col = {c: fields.index(c) for c in fields}
                ncols = len(fields)
            continue                         # preamble: the program's own output
        if len(fields) != ncols:
            raise CountersError(f"ncu CSV line {n}: {len(fields)} fields, the header has "
                                f"{ncols}: {line[:80]!r}")
        try:
            kid, pid = int(fields[col["ID"]]), int(fields[col["Process ID"]])
        except ValueError:
            raise CountersError(f"ncu CSV line {n}: ID/Process ID not integers: "
                                f"{line[:80]!r}") from None
        try:
            v = number(fields[col["Metric Value"]])
            f = unit_factor(fields[col["Metric Unit"]])
        except CountersError as e:
            raise CountersError(f"ncu CSV line {n}: {e}") from None
        r = rows.setdefault(kid, KernelRow(kid, pid, fields[col["Kernel Name"]]))
        if r.pid != pid or r.name != fields[col["Kernel Name"]]:
            raise CountersError(f"ncu CSV line {n}: kernel ID {kid} names another "
                                f"kernel or process than before")
        if v is not None:
            r.metrics[fields[col["Metric Name"]]] = v * f
    if col is None:
        raise CountersError("no ncu CSV header (a line with "
                            + ", ".join(f'"{c}"' for c in NEED) + ") in the output")
    return [rows[k] for k in sorted(rows)]

"""The sample store: profiles of one device, one JSONL file per sample kind.

    <root>/<device-slug>/<kind>.jsonl

The first line of a file is its header ({"store": 1, "kind", "schema_version",
"schema_fingerprint", "device", "created"}); every other line is one sample:

    {"key": "...", "src": "synthetic|profile|...", "f": {features}, "t": {targets}}

The key names what was measured (app, input, quota, repetition ...), so a
profiler that is stopped and restarted asks `keys()` and skips what is there;
appending a key that is already present is a no-op.  Appenders take turns
with flock(2); a line torn by a crash is skipped when loading (and counted)
and ended before the next append.  A store never mixes schema versions: an
old file must be moved away, not appended to.
"""
from __future__ import annotations

import datetime as _dt
import fcntl
import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping

import numpy as np

from predictors import schema as S

STORE_FORMAT = 1


class StoreError(Exception):
    pass


def slug(device: str) -> str:
    """A directory name for a device name ("NVIDIA H100 80GB HBM3" -> nvidia-h100-80gb-hbm3)."""
    s = re.sub(r"[^a-z0-9]+", "-", device.lower()).strip("-")
    return s or "device"


def default_root() -> Path:
    """$COLOCATE_DATA_DIR/profiles, else $XDG_DATA_HOME/colocate/profiles, else ~/.local/share/..."""
    base = os.environ.get("COLOCATE_DATA_DIR")
    if base:
        return Path(base) / "profiles"
    xdg = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(xdg) / "colocate" / "profiles"


@dataclass
class SampleSet:
    """Samples of one kind as arrays, categorical features still as names."""
    kind: S.Kind
    device: str
    keys: list[str]
    sources: list[str]
    rows: list[dict[str, Any]]          # feature dicts, as stored
    Y: np.ndarray                       # (n, targets) float64, NaN where a target is missing
    torn: int = 0                       # unreadable lines skipped
    source_counts: dict[str, int] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.keys)

    def X(self, vocab: S.Vocab) -> np.ndarray:
        return S.encode(self.kind, self.rows, vocab)

    def y(self, target: str) -> np.ndarray:
        return self.Y[:, self.kind.target_names.index(target)]


class Store:
    """Samples of one device."""

    def __init__(self, root: Path | str, device: str):
        self.root = Path(root)
        self.device = device
        self.dir = self.root / slug(device)
        self._keys: dict[str, tuple[int, set[str]]] = {}     # kind -> (file size, keys)

    def path(self, kind: str) -> Path:
        return self.dir / f"{S.kind(kind).name}.jsonl"

    def header(self, kind: str) -> dict[str, Any] | None:
        p = self.path(kind)
        if not p.exists():
            return None
        with p.open() as fh:
            first = fh.readline()
        if not first.strip():
            return None                 # created by an append that had nothing new
        try:
            h = json.loads(first)
        except json.JSONDecodeError:
            raise StoreError(f"{p}: first line is not a store header") from None
        if not isinstance(h, dict) or h.get("store") != STORE_FORMAT:
            raise StoreError(f"{p}: not a sample store of format {STORE_FORMAT}")
        return h

    def _check(self, kind: S.Kind, h: Mapping[str, Any]) -> None:
        p = self.path(kind.name)
        if h.get("kind") != kind.name:
            raise StoreError(f"{p}: holds {h.get('kind')!r} samples, not {kind.name!r}")
        if h.get("schema_version") != kind.version or h.get("schema_fingerprint") != kind.fingerprint():
            raise StoreError(f"{p}: schema version {h.get('schema_version')} "
                             f"({h.get('schema_fingerprint')}) differs from this build's "
                             f"{kind.version} ({kind.fingerprint()}); move the file away "
                             f"and profile again")

    def keys(self, kind: str) -> set[str]:
        """Keys already stored: what a resumed profiler skips.  Cached while
        the file keeps the size it had when read."""
        p = self.path(kind)
        try:
            size = p.stat().st_size
        except FileNotFoundError:
            return set()
        if size == 0:
            return set()
        hit = self._keys.get(kind)
        if hit is None or hit[0] != size:
            hit = (size, set(self.load(kind).keys))
            self._keys[kind] = hit
        return set(hit[1])

    def append(self, kind: str, samples: Iterable[Mapping[str, Any]], src: str = "profile") -> int:
        """Add samples ({"key", "f", "t"} dicts, "src" optional); returns how
        many were new.  Features are checked against the schema.  Writers
        of the same file take turns (flock), so lines never interleave."""
        k = S.kind(kind)
        p = self.path(kind)
        self.dir.mkdir(parents=True, exist_ok=True)
        with p.open("a+") as fh:
            fcntl.flock(fh.fileno(), fcntl.LOCK_EX)
            size = os.fstat(fh.fileno()).st_size
            fresh = size == 0
            if not fresh:
                h = self.header(kind)
                if h is None:
                    raise StoreError(f"{p}: no header line")
                self._check(k, h)
            have = set() if fresh else self.keys(kind)
            lines: list[str] = []
            for smp in samples:
                key = str(smp["key"])
                if key in have:
                    continue
                S.check_rows(k, [smp["f"]])
                unknown = set(smp["t"]) - set(k.target_names)
                if unknown:
                    raise ValueError(f"{kind} sample {key}: unknown targets {sorted(unknown)}")
                have.add(key)
                lines.append(json.dumps({"key": key, "src": smp.get("src", src),
                                         "f": dict(smp["f"]), "t": dict(smp["t"])},
                                        separators=(",", ":")))
            if not lines:
                return 0
            if not fresh and os.pread(fh.fileno(), 1, size - 1) != b"\n":
                fh.write("\n")                 # end a line torn by a crash first
            if fresh:
                fh.write(json.dumps({"store": STORE_FORMAT, "kind": k.name,
                                     "schema_version": k.version,
                                     "schema_fingerprint": k.fingerprint(),
                                     "device": self.device,
                                     "created": _dt.datetime.now(_dt.timezone.utc).isoformat()})
                         + "\n")
            fh.write("\n".join(lines) + "\n")
            fh.flush()
            os.fsync(fh.fileno())
            self._keys[kind] = (os.fstat(fh.fileno()).st_size, have)
        return len(lines)

    def load(self, kind: str) -> SampleSet:
        k = S.kind(kind)
        p = self.path(kind)
        h = self.header(kind)
        if h is None:
            raise StoreError(f"no {kind} samples for device {self.device!r} ({p})")
        self._check(k, h)
        keys: list[str] = []
        srcs: list[str] = []
        rows: list[dict[str, Any]] = []
        ys: list[list[float]] = []
        torn = 0
        seen: set[str] = set()
        tnames = k.target_names
        with p.open() as fh:
            fh.readline()
            for line in fh:
                try:
                    smp = json.loads(line)
                    key, f, t = str(smp["key"]), smp["f"], smp["t"]
                except (json.JSONDecodeError, KeyError, TypeError):
                    torn += 1
                    continue
                if key in seen:
                    continue
                seen.add(key)
                keys.append(key)
                srcs.append(str(smp.get("src", "profile")))
                rows.append(f)
                ys.append([float(t[n]) if n in t else np.nan for n in tnames])
        counts: dict[str, int] = {}
        for s in srcs:
            counts[s] = counts.get(s, 0) + 1
        Y = np.array(ys, dtype=np.float64).reshape(len(ys), len(tnames))
        return SampleSet(k, str(h.get("device", self.device)), keys, srcs, rows, Y, torn, counts)

"""The MPS baselines of C-Laius's evaluation: static SM percentages.

mps-even      every app gets 200 % / n (NVIDIA's advice for MPS: the
              percentage is a cap, not a reservation, so the caps may add up
              to more than 100 % and idle SMs are still used); total=100
              divides 100 % instead, C-Laius's "even allocation" (Fig. 2)
mps-priority  QoS apps get 100 %; the batch apps share the rest evenly,
              100 % / (number of batch apps) each

Both recompute every app's share when an app arrives or leaves.  Shares are
rounded down to the pool's granularity (default 10 %, at least one unit),
and routed to a pool worker of that quota (route None); 100 % runs locally.
"""
from __future__ import annotations

from controlplane.policies.base import AppInfo, Decision, Policy, register_policy


def round_share(pct: float, granularity: int) -> int:
    """pct rounded down to a multiple of granularity, within [granularity, 100]."""
    units = int(pct // granularity)
    return max(granularity, min(100, units * granularity))


class _Shares(Policy):
    """Common bookkeeping: the live apps, and one decision per app whose share changed."""

    def __init__(self, granularity: int = 10, **opts):
        super().__init__(**opts)
        if not 1 <= granularity <= 100 or 100 % granularity:
            raise ValueError(f"granularity must divide 100, got {granularity}")
        self.g = int(granularity)
        self.apps: dict[int, AppInfo] = {}
        self.given: dict[int, int] = {}

    def shares(self) -> dict[int, int]:
        raise NotImplementedError

    def _decide(self) -> list[Decision]:
        out = []
        for slot, q in sorted(self.shares().items()):
            if self.given.get(slot) != q:
                self.given[slot] = q
                out.append(Decision(slot, q, None if q < 100 else 0))
        return out

    def on_register(self, app: AppInfo) -> list[Decision]:
        self.apps[app.slot] = app
        return self._decide()

    def on_exit(self, app: AppInfo) -> list[Decision]:
        self.apps.pop(app.slot, None)
        self.given.pop(app.slot, None)
        return self._decide()


@register_policy("mps-even")
class MpsEven(_Shares):
    def __init__(self, total: float = 200.0, **opts):
        super().__init__(**opts)
        if not 0 < float(total) <= 1000:
            raise ValueError(f"total must be in (0, 1000] percent, got {total}")
        self.total = float(total)

    def shares(self) -> dict[int, int]:
        n = len(self.apps)
        return {s: round_share(self.total / n, self.g) for s in self.apps} if n else {}


@register_policy("mps-priority")
class MpsPriority(_Shares):
    def shares(self) -> dict[int, int]:
        batch = [s for s, a in self.apps.items() if a.cls != "qos"]
        out = {s: 100 for s, a in self.apps.items() if a.cls == "qos"}
        out.update({s: round_share(100.0 / len(batch), self.g) for s in batch})
        return out

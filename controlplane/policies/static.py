"""static: every app runs locally at its requested quota (or 100 %)."""
from __future__ import annotations

from controlplane.policies.base import AppInfo, Decision, Policy, register_policy


@register_policy("static")
class Static(Policy):
    def on_register(self, app: AppInfo) -> list[Decision]:
        return [Decision(app.slot, app.requested_quota_pct or 100, 0)]

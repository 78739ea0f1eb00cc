"""Policies: each module registers one with @register_policy(name); the
controller builds it with make_policy(name, **opts)."""
from controlplane.policies.base import (
                                        AppInfo,
                                        Decision,
                                        Policy,
                                        QueryEvent,
                                        TaskDone,
                                        make_policy,
                                        make_policy_spec,
                                        parse_policy_spec,
                                        policy_names,
                                        register_policy,
)

__all__ = ["AppInfo", "Decision", "Policy", "QueryEvent", "TaskDone", "make_policy", "make_policy_spec",
           "parse_policy_spec", "policy_names", "register_policy"]

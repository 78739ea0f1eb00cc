"""Predictors of duration, bandwidth and IPC per SM quota.

Built by the predictors issue; nothing here yet."""

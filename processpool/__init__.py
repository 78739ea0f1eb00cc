"""MPS process pool: workers at fixed SM quotas that run forwarded launches.

Built by the process-pool issue; nothing here yet."""

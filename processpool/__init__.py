"""MPS process pool: worker processes at fixed SM quotas that run the launches
the shim forwards to them (an app's route in the control block names one).

    from processpool import Pool, parse_spec
    pool = Pool(rundir, "sim", parse_spec("10:2,50:2,100:1"))

See processpool/pool.py for the worker contract and processpool/mps.py for
the MPS control daemon (device cuda)."""
from processpool.mps import Mps, MpsError
from processpool.pool import (
                              DEFAULT_SPEC,
                              MAX_WORKERS,
                              SPEC_HELP,
                              Pool,
                              PoolError,
                              SpecError,
                              format_spec,
                              parse_spec,
                              worker_env,
)

__all__ = ["DEFAULT_SPEC", "MAX_WORKERS", "SPEC_HELP", "Mps", "MpsError", "Pool", "PoolError",
           "SpecError", "format_spec", "parse_spec", "worker_env"]

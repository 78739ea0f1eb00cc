"""colocate shim: the LD_PRELOAD interception library, the simgpu test device,
and the Python side of what the shim reads: the runtime directory (rundir),
an app's environment under the shim (launcher), the shared control block
and ledgers.  The bottom layer: it imports nothing of processpool,
predictors or controlplane."""

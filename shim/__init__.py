"""colocate shim: the LD_PRELOAD interception library, the simgpu test device
and the Python view of the shared control block."""

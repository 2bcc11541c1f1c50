"""The runtime: the engine (inputs in, commits, effects out), stream cores, provider gates
live, the scheduler, snapshots, the cluster (membership, ownership, peers)."""

"""The runtime: the engine (inputs in, commits, effects out), stream cores, provider gates
live, the scheduler, snapshots, the cluster (membership, ownership, peers), the read models
the panel asks for (run history, charts, search, the blotter), clocks and tasks."""

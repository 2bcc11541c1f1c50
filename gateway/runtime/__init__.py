"""The runtime: the engine (inputs in, commits, effects out), stream cores, provider gates
live, the scheduler, snapshots. It holds only the streams this process owns (`load`,
`unload` and `drop` of the engine's `holding` and of the gate); who owns what, in a cluster,
is `gateway.cluster`'s."""

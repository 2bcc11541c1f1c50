"""Several gateway processes on one log (PostgreSQL): which process decides for which stream.

The engine (`gateway.runtime.engine`) and the provider gates hold only what this process
decides for; everything about the others lives here:

- `member`: this process's lease and its share of the streams (`Cluster`), which it loads
  into the engine and the gates, unloads when handing over, drops when its lease is lost;
- `replicas`: one follower of the log for every stream decided elsewhere (agents and gates),
  so that every process serves reads of every agent;
- `router`: the way in for requests, split by owner before the engine sees them: this
  process's own go to its engine, the others to their owners (`peers`);
- `peers`: the HTTP clients to the other processes.

One process or a cluster is a choice made in wiring (`gateway.wiring`): a gateway on SQLite
builds none of this.
"""

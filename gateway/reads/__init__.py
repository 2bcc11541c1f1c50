"""The read models the panel asks for, which the engine never uses: run history, charts and
search, the blotter, an agent's or a run's story (`story`, found through the index of
`stories`), replays of a stream to a position, stream tails and why an agent is blocked."""

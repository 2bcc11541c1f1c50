"""The network edge: WebSocket sessions, the HTTP API, auth, the wire protocol, the HTTP
server, intake of feed work, metrics."""

"""`/v1/responses` (HTTP and WebSocket) and `/v1/responses/compact`.

`protocol`, `protocol_items`, `protocol_events`: the wire models, input items and the response
object with its events (pure). `conversation`: stored snapshots and `previous_response_id`;
`compaction`: the sealed summary items; `turns`: the one loop that runs a turn; `background`:
runs that outlive their request; `serving`: the endpoint's logic; `router` and `websocket`: HTTP.
"""

"""What both wings speak besides the protobuf stubs (`specroute/v1/`).

`router/` and `engines/` may import this package; it imports neither of them, nor torch, FastAPI
or grpc. Modules:

- `stats`: the one acceptance-statistics record (drafted / accepted / steps) and its formulas.
- `feedback`: the per-request feedback record and the Redis layout both sides read and write.
- `context`: the request context (domain x script x temperature x size) statistics are keyed by.
- `split`: the held-out rule (ids no model trains on; the benchmarks' prompts).
"""

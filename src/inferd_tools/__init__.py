"""inferd's tools, apart from the server: `inferd bench` (a load generator for any v2 server),
`inferd tune` (a batching and instance sweep) and `inferd optimize` (lighter variants of a
model, measured and published)."""

"""inferd's tools, apart from the server: `inferd bench` (a load generator for any v2 server),
`inferd tune` (a batching and instance sweep) and `inferd optimize` (lighter variants of a
model, measured and published).

They reach the server only through its wire protocols, the repository layout on disk and
`inferd.public`, the names the server promises to keep (tests/unit/test_public_surface.py
holds them to it). The `inferd` command registers them through `inferd_tools.commands`.
"""

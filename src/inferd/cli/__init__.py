"""The `inferd` command line."""

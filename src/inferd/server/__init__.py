"""Build the server from settings, run it, and shut it down in order."""

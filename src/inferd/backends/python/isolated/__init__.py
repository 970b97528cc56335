"""A Python model in a process of its own (`isolation: "process"`): both ends of its pipe."""

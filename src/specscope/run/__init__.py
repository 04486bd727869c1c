"""A run: its config, its manifest, and the command that measures it."""

"""Processes, I/O errors, paths, user extension imports, cached folders, third-party noise."""

"""The run folder: its lock, overwrite and resume, checkpoints and their manifests."""

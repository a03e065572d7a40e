"""The machine: CPU and GPU facts, the device choice, the compute precision."""

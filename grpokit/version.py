"""grpokit's version, in a module of its own so that parts recording it need not import the package root (whose
lazy accessors reach the trainer)."""

__version__ = "0.1.0"

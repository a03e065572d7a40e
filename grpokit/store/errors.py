"""The store's error, shared by the store and its integrity checks."""


class StoreError(Exception):
    """A rollout store cannot be opened, written or queried as asked."""

"""The store's error, shared by the store and its integrity checks."""


class StoreError(Exception):
    """A rollout store cannot be opened, written or queried as asked."""


class QueryError(StoreError):
    """An ad-hoc SQL query is not a single read-only SELECT, or SQLite rejects it."""

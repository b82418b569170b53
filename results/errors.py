"""The one error the results store raises."""


class StoreError(RuntimeError):
    """A results database that cannot be used; the message is one line."""

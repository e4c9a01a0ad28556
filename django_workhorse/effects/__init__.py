"""The effect ledger: ``once()`` and ``once_block()`` for a handler's writes in this database."""

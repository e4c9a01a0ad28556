"""Tasks: ``@task``, handler signatures, the handler registry and retry policies."""

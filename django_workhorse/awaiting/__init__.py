"""Waits on results (decision 0022 §5): ``waiting`` (``wait_for``, ``await_for``, and the waits of
``EnqueueResult`` and ``WorkflowResult``) and ``listener`` (one LISTEN connection per process)."""

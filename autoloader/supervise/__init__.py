"""Supervising DataLoader worker processes, apart from measuring them: one iterator started, read, stopped and reaped
(``serving``), the workers found, sampled, stopped and reaped (``procs``), and the signal guard that raises the hard
limit, Ctrl-C and a worker's death only at a safe line (``signals``, with ``redelivery``, ``unsafe``,
``torch_watch``; outside a guard, a worker's death alone: ``deaths``)."""

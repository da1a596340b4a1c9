"""Measuring one candidate configuration: the one measured loop (``run``), its window, the consumer step, the CPU
clocks, failures, and the dataset advice a trial gives; ``trial`` drives one before training. The worker processes it
measures are started, guarded and reaped by ``autoloader.supervise``."""

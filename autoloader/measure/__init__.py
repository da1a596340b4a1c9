"""Measuring one candidate configuration: the one measured loop (``run``), its window, the consumer step, the signal
guard, worker processes, failures, and the dataset advice a trial gives; ``trial`` drives one before training."""

"""What runs during training: the prefetcher (``prefetch``), its device copies and input transform, batch helpers,
threads inside each loading process (``threads``), and checkpoint/resume (``state``: what is saved; ``resume``: the
rest of an interrupted epoch)."""

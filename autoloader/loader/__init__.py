"""What runs during training: the prefetcher (``prefetch``), its device copies and input transform, batch helpers,
and threads inside each loading process (``threads``)."""

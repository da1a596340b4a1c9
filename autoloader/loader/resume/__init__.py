"""Exact resume: what ``PrefetchLoader.state_dict`` holds (``state``), the RNG states in it (``rng``), the
prefetcher's bookkeeping of them (``checkpoint``) and the rest of an interrupted epoch redrawn (``redraw``); NOTE [
Exact resume ] in state.py says how."""

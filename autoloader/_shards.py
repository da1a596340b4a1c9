"""How many shards an IterableDataset reads, where the dataset says: more workers than shards have nothing to read.

WebDataset splits its shard list between workers (``split_by_worker``) and, with too few shards, a worker's share is
empty and it raises "No samples found in dataset; perhaps you have fewer shards than workers"; a Hugging Face
``datasets.IterableDataset`` stops the extra workers with a warning. Either way workers beyond the shard count (per
rank) are wasted, so the tuner never tries more. ``None`` when the dataset does not say (never a guess).
"""
from __future__ import annotations

from typing import Any, Optional

import torch.distributed as dist


def shard_count(dataset: Any) -> Optional[int]:
    """Shards this rank's workers share: ``num_shards``/``n_shards`` (Hugging Face ``datasets``), else the URL list
    of a WebDataset pipeline's first stage (its ``SimpleShardList``; a resampled list is endless), divided among the
    ranks when the pipeline splits by node."""
    for name in ("num_shards", "n_shards"):
        value = getattr(dataset, name, None)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    stages = getattr(dataset, "pipeline", None)
    if not isinstance(stages, list) or not stages:
        return None
    urls = getattr(stages[0], "urls", None)
    if type(stages[0]).__name__.startswith("Resampled") or not isinstance(urls, (list, tuple)) or not urls:
        return None
    if any(getattr(stage, "__name__", "") == "split_by_node" for stage in stages) and dist.is_available() \
            and dist.is_initialized():
        rank, world = dist.get_rank(), dist.get_world_size()
        return max(1, len(urls[rank::world]))
    return len(urls)

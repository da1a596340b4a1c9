"""One rank of the Hugging Face ``datasets`` test: an Arrow dataset loaded from disk, ``with_format("torch")``,
through ``make_loader`` with dict batches and ``normalize=``/``dtype=``/``input_key="pixels"``, under torchrun.

    python -m torch.distributed.run --standalone --nproc_per_node=2 tests/integrations/hf_datasets_script.py \
        DATASET_DIR OUT_DIR CACHE_DIR

Each rank writes OUT_DIR/rank<R>.json: the ``idx`` of every sample per epoch (the torchrun recipe: ``set_epoch``
before each epoch), its ``loader.tuning``, and whether every batch's pixels came out float32 and normalised.
"""
from __future__ import annotations

import argparse
import traceback

import datasets
import torch
import torch.distributed as dist
from torch.utils.data.distributed import DistributedSampler

from autoloader import make_loader

from _helpers import BUDGET_S, arm_watchdog, write_report

MEAN, STD = (10.0, 20.0, 30.0), (2.0, 4.0, 8.0)
EPOCHS = 3


def hf_loader(path: str, cache_dir: str, tuning: str = "auto"):
    ds = datasets.load_from_disk(path).with_format("torch")
    return make_loader(ds, batch_size=8, shuffle=True, device="cpu", cache=cache_dir, budget=BUDGET_S,
                       max_workers=2, normalize=(MEAN, STD), dtype=torch.float32, input_key="pixels",
                       tuning=tuning)


def check_batch(batch) -> bool:
    """pixels: float32, ((idx % 256) - mean) / std per channel; the other entries untouched."""
    pixels, idx = batch["pixels"], batch["idx"]
    if pixels.dtype != torch.float32 or idx.dtype != torch.int64:
        return False
    raw = (idx % 256).to(torch.float32).view(-1, 1, 1, 1).expand(-1, 3, 8, 8)
    expected = (raw - torch.tensor(MEAN).view(1, 3, 1, 1)) / torch.tensor(STD).view(1, 3, 1, 1)
    return bool(torch.allclose(pixels, expected))


def main() -> None:
    arm_watchdog()
    parser = argparse.ArgumentParser()
    parser.add_argument("dataset_dir")
    parser.add_argument("out_dir")
    parser.add_argument("cache_dir")
    args = parser.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    report = {"rank": rank, "world_size": dist.get_world_size(), "error": None}
    try:
        loader = hf_loader(args.dataset_dir, args.cache_dir)
        report["sampler"] = type(loader.loader.sampler).__name__
        report["sampler_is_distributed"] = isinstance(loader.loader.sampler, DistributedSampler)
        epochs, ok = [], True
        for epoch in range(EPOCHS):
            loader.set_epoch(epoch)
            seen = []
            for batch in loader:
                ok = ok and check_batch(batch)
                seen.extend(int(i) for i in batch["idx"])
            epochs.append(seen)
        report["epochs"], report["batches_ok"] = epochs, ok
        report["tuning"] = loader.tuning.to_dict()  # in force since the first iter()
    except Exception as exc:
        report["error"] = f"{type(exc).__name__}: {exc}"
        report["traceback"] = traceback.format_exc()[-3000:]
    write_report(args.out_dir, rank, report)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

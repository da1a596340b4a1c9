"""One Lightning DDP run (2 CPU processes, gloo) whose ``train_dataloader()`` returns ``make_loader(...)``.

    python tests/integrations/lightning_script.py OUT_DIR CACHE_DIR --use-distributed-sampler {0,1} [--plain]

Lightning's own launcher starts rank 1 by running this script again. Each rank writes OUT_DIR/rank<R>.json: the
sample ids it trained on per epoch, its ``loader.tuning``, what Lightning saw of the loader (its type, sampler and
the sampler's epoch), and the DataLoader workers still alive after ``fit`` returned. ``--plain`` returns a plain
``torch.utils.data.DataLoader`` instead (the baseline Lightning handles itself).
"""
from __future__ import annotations

import argparse
import logging
import warnings

import torch

import lightning as L
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler

from autoloader import make_loader

from _helpers import BUDGET_S, Indexed, arm_watchdog, write_report

N = 64
BATCH = 8


class Model(L.LightningModule):
    """Records the sample ids of every batch it trains on, per epoch."""

    def __init__(self, args: argparse.Namespace) -> None:
        super().__init__()
        self.args = args
        self.layer = torch.nn.Linear(3 * 8 * 8, 1)
        self.seen = {}
        self.loader = None

    def train_dataloader(self):
        return self.build_loader()

    def build_loader(self):
        if self.args.plain:
            self.loader = DataLoader(Indexed(N), batch_size=BATCH, shuffle=True, num_workers=1,
                                     persistent_workers=True)
        else:
            fixed = {} if self.args.num_workers is None else {"num_workers": self.args.num_workers}
            self.loader = make_loader(Indexed(N), batch_size=BATCH, shuffle=True, device="cpu",
                                      cache=self.args.cache_dir, budget=BUDGET_S, max_workers=2, **fixed)
        return self.loader

    def training_step(self, batch, batch_idx):
        images, ids = batch
        self.seen.setdefault(self.current_epoch, []).extend(int(i) for i in ids)
        return self.layer(images.float().flatten(1)).mean()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


def main() -> None:
    arm_watchdog()
    parser = argparse.ArgumentParser()
    parser.add_argument("out_dir")
    parser.add_argument("cache_dir")
    parser.add_argument("--use-distributed-sampler", type=int, choices=(0, 1), default=1)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--plain", action="store_true")
    parser.add_argument("--outside", action="store_true",
                        help="build the loader before Trainer.fit and pass it as fit(train_dataloaders=...)")
    parser.add_argument("--num-workers", type=int, default=None, help="fix num_workers (the rest is still tuned)")
    args = parser.parse_args()
    logging.getLogger("lightning").setLevel(logging.ERROR)
    warnings.filterwarnings("ignore", category=UserWarning)
    model = Model(args)
    trainer = L.Trainer(accelerator="cpu", devices=2, strategy="ddp", max_epochs=args.epochs,
                        use_distributed_sampler=bool(args.use_distributed_sampler), logger=False,
                        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                        num_sanity_val_steps=0)
    if args.outside:  # before fit: torch.distributed is not initialised yet
        trainer.fit(model, train_dataloaders=model.build_loader())
    else:
        trainer.fit(model)
    loader = model.loader
    inner = getattr(loader, "loader", loader)
    sampler = getattr(inner, "sampler", None)
    workers = _live_workers(inner)
    tuning = getattr(loader, "tuning", None)
    write_report(args.out_dir, trainer.global_rank, {
        "rank": trainer.global_rank,
        "world_size": trainer.world_size,
        "epochs": [model.seen.get(e, []) for e in range(args.epochs)],
        "tuning": None if tuning is None else tuning.to_dict(),
        "loader_type": type(trainer.fit_loop._combined_loader.flattened[0]).__name__,
        "sampler": type(sampler).__name__,
        "sampler_is_distributed": isinstance(sampler, DistributedSampler),
        "sampler_epoch": getattr(sampler, "epoch", None),
        "workers_alive_after_fit": workers,
        "num_workers": getattr(inner, "num_workers", None),
        "persistent_workers": getattr(inner, "persistent_workers", None),
    })


def _live_workers(inner) -> list:
    """PIDs of the DataLoader's (persistent) workers still alive after fit: Lightning shuts down the workers of the
    loaders it knows how to reach (``loader._iterator``) when fit ends."""
    iterator = getattr(inner, "_iterator", None)
    return [w.pid for w in getattr(iterator, "_workers", []) if w.is_alive()]


if __name__ == "__main__":
    main()

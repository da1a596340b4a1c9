"""Lightning DDP (2 CPU processes, gloo) killed mid-epoch and resumed from its checkpoint (issue 21).

    python tests/integrations/lightning_resume_script.py OUT_DIR CACHE_DIR --phase {full,killed,resume} [--ckpt F]

``full`` trains EPOCHS epochs uninterrupted; ``killed`` checkpoints every EVERY steps (``ModelCheckpoint``, which
stores ``loader.state_dict()`` because a PrefetchLoader has state_dict/load_state_dict) and SIGKILLs every rank when
step KILL starts; ``resume`` is ``fit(ckpt_path=...)`` in a fresh launch, maybe with another configuration
(``--num-workers``). Each finished rank writes OUT_DIR/rank<R>.json: the sample ids of every step, by global step.
"""
from __future__ import annotations

import argparse
import logging
import os
import signal
import warnings

import torch

import lightning as L
from lightning.pytorch.callbacks import ModelCheckpoint

from autoloader import make_loader

from _helpers import BUDGET_S, Indexed, arm_watchdog, write_report

N = 96
BATCH = 8
EPOCHS = 3  # 6 steps per epoch and rank
EVERY = 4   # checkpoints after steps 4, 8: the one after step 8 is mid-epoch 1
KILL = 10


class Model(L.LightningModule):
    def __init__(self, args: argparse.Namespace) -> None:
        super().__init__()
        self.args = args
        self.layer = torch.nn.Linear(3 * 8 * 8, 1)
        self.steps = {}

    def train_dataloader(self):
        fixed = {} if self.args.num_workers is None else {"num_workers": self.args.num_workers}
        return make_loader(Indexed(N), batch_size=BATCH, shuffle=True, device="cpu", cache=self.args.cache_dir,
                           budget=BUDGET_S, max_workers=2, **fixed)

    def training_step(self, batch, batch_idx):
        if self.args.phase == "killed" and self.global_step == KILL:
            os.kill(os.getpid(), signal.SIGKILL)  # a preemption: no cleanup, no more checkpoint
        images, ids = batch
        self.steps[int(self.global_step)] = [int(i) for i in ids]
        torch.rand(2)  # the loop's own draws, as dropout makes
        return self.layer(images.float().flatten(1)).mean()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


def main() -> None:
    arm_watchdog()
    parser = argparse.ArgumentParser()
    parser.add_argument("out_dir")
    parser.add_argument("cache_dir")
    parser.add_argument("--phase", choices=("full", "killed", "resume"), required=True)
    parser.add_argument("--ckpt", default=None)
    parser.add_argument("--num-workers", type=int, default=None)
    args = parser.parse_args()
    logging.getLogger("lightning").setLevel(logging.ERROR)
    warnings.filterwarnings("ignore", category=UserWarning)
    L.seed_everything(0, verbose=False)
    model = Model(args)
    callbacks = [ModelCheckpoint(dirpath=os.path.join(args.out_dir, "ckpt"), filename="s{step}", save_top_k=-1,
                                 every_n_train_steps=EVERY, auto_insert_metric_name=False)]
    killed = args.phase == "killed"
    trainer = L.Trainer(accelerator="cpu", devices=2, strategy="ddp", max_epochs=EPOCHS, logger=False,
                        default_root_dir=args.out_dir,
                        callbacks=callbacks if killed else [], enable_checkpointing=killed,
                        enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0)
    trainer.fit(model, ckpt_path=args.ckpt)
    write_report(args.out_dir, trainer.global_rank, {"rank": trainer.global_rank, "steps": model.steps})


if __name__ == "__main__":
    main()

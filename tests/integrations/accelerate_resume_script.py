"""Accelerate (torchrun, 2 CPU processes, gloo): ``accelerator.register_for_checkpointing(loader)`` makes
``save_state``/``load_state`` carry a PrefetchLoader's state (issue 21).

    torchrun --nproc_per_node=2 tests/integrations/accelerate_resume_script.py OUT_DIR CACHE_DIR --phase {full,resume}

``full`` trains EPOCHS epochs and calls ``save_state(OUT_DIR/state)`` after step SAVE (mid-epoch 1); ``resume`` is a
fresh launch that registers a new loader, calls ``load_state`` and trains to the end. Each rank writes
OUT_DIR/rank<R>.json: the sample ids of every step, by step number (``accelerator.prepare`` leaves a PrefetchLoader
unchanged, so its state is not among Accelerate's own dataloader states: registering it is the recipe).
"""
from __future__ import annotations

import argparse
import os
import warnings

import torch
from accelerate import Accelerator

from autoloader import make_loader

from _helpers import BUDGET_S, Indexed, arm_watchdog, write_report

N, BATCH, EPOCHS, SAVE = 96, 8, 3, 8  # 6 steps per epoch and rank: the save is after batch 2 of epoch 1


def main() -> None:
    arm_watchdog()
    parser = argparse.ArgumentParser()
    parser.add_argument("out_dir")
    parser.add_argument("cache_dir")
    parser.add_argument("--phase", choices=("full", "resume"), required=True)
    parser.add_argument("--state-dir", required=True)
    args = parser.parse_args()
    warnings.filterwarnings("ignore", category=UserWarning)
    accelerator = Accelerator(cpu=True)
    torch.manual_seed(0)
    model = torch.nn.Linear(3 * 8 * 8, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    loader = make_loader(Indexed(N), batch_size=BATCH, shuffle=True, device="cpu", cache=args.cache_dir,
                         budget=BUDGET_S, max_workers=2)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    accelerator.register_for_checkpointing(loader)
    step = 0
    if args.phase == "resume":
        accelerator.load_state(args.state_dir)
        step = SAVE
    steps = {}
    while step < EPOCHS * len(loader):
        for images, ids in loader:
            steps[step] = [int(i) for i in ids]
            accelerator.backward(model(images.float().flatten(1)).mean())
            optimizer.step()
            optimizer.zero_grad()
            step += 1
            if args.phase == "full" and step == SAVE:
                accelerator.save_state(args.state_dir)
    write_report(args.out_dir, accelerator.process_index, {"rank": accelerator.process_index, "steps": steps,
                                                           "saved": os.listdir(args.state_dir)})
    accelerator.end_training()


if __name__ == "__main__":
    main()

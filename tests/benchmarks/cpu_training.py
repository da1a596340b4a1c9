"""A user's CPU training script (issue 59, item 3): a small CNN trained on the CPU over JPEG images decoded and
augmented in the dataset, a validation pass after each epoch; both loaders plain ``DataLoader``s at a fixed
``num_workers``, or both ``make_loader`` (the default: tuned online, no cache).

    python tests/benchmarks/cpu_training.py auto          # make_loader for both loaders
    python tests/benchmarks/cpu_training.py 2             # DataLoader(num_workers=2, persistent_workers=True)
    python tests/benchmarks/cpu_training.py 0 --epochs 3 --samples 1600

Prints one line per epoch, then one JSON line: the mode, the wall time of the whole run (loaders made, every epoch,
the validation passes), each epoch's seconds, its training step's mean seconds and the loop's mean wait per batch,
the decisions ``make_loader`` made. ``test_bench_cpu_step.py`` runs it in fresh interpreters, side by side. Only what
the default install has (torch, numpy, autoloader) plus Pillow (the ``bench`` extra), as a new user's script would.

The step keeps torch's intra-op pool busy on every usable CPU, the workers' cores: the question is whether workers
pay at all beside it (on 2 cores a ResNet-18 trained this way ran 1.33x slower with the one worker autoloader chose
than with none, issue 59).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any, Dict, List

import torch
import torch.nn.functional as F
from torch import nn

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))  # tests/: workloads.py

from workloads import JpegDecode  # noqa: E402 - after the path

BATCH = 32


class SmallCNN(nn.Module):
    """Three convolutions and a linear head: ~20k parameters, 10 classes."""

    def __init__(self) -> None:
        super().__init__()
        self.c1, self.c2 = nn.Conv2d(3, 16, 3, padding=1), nn.Conv2d(16, 32, 3, padding=1)
        self.c3, self.fc = nn.Conv2d(32, 64, 3, padding=1), nn.Linear(64, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.max_pool2d(F.relu(self.c1(x)), 2)
        x = F.max_pool2d(F.relu(self.c2(x)), 2)
        return self.fc(F.relu(self.c3(x)).mean((2, 3)))


def loaders(mode: str, train_set: Any, val_set: Any) -> tuple:
    if mode == "auto":
        from autoloader import make_loader

        return (make_loader(train_set, batch_size=BATCH, shuffle=True, cache=False),
                make_loader(val_set, batch_size=BATCH, cache=False))
    n = int(mode)
    from torch.utils.data import DataLoader

    return (DataLoader(train_set, batch_size=BATCH, shuffle=True, num_workers=n, persistent_workers=n > 0),
            DataLoader(val_set, batch_size=BATCH, num_workers=n, persistent_workers=n > 0))


def run(mode: str, *, samples: int, epochs: int, size: int, crop: int) -> Dict[str, Any]:
    torch.manual_seed(0)
    started = time.perf_counter()
    train_set = JpegDecode(n=256, size=size, crop=crop, seed=0)
    val_set = JpegDecode(n=64, size=size, crop=crop, seed=1)
    train_loader, val_loader = loaders(mode, _Take(train_set, samples), _Take(val_set, samples // 4))
    model = SmallCNN()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    epoch_s: List[float] = []
    step_s: List[float] = []
    wait_s: List[float] = []
    for epoch in range(epochs):
        began = asked = time.perf_counter()
        steps = waits = 0.0
        batches = 0
        model.train()
        for images, labels in train_loader:
            got = time.perf_counter()
            waits += got - asked
            loss = F.cross_entropy(model(images.float().div_(255)), labels)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            asked = time.perf_counter()
            steps += asked - got
            batches += 1
        model.eval()
        with torch.no_grad():
            for images, _ in val_loader:
                model(images.float().div_(255))
        epoch_s.append(time.perf_counter() - began)
        step_s.append(steps / max(1, batches))
        wait_s.append(waits / max(1, batches))
        print(f"{mode}: epoch {epoch + 1} {epoch_s[-1]:.2f} s, step {1e3 * step_s[-1]:.1f} ms, wait "
              f"{1e3 * wait_s[-1]:.1f} ms a batch", flush=True)
    wall = time.perf_counter() - started
    decisions = [f"{d.config.label()} ({d.why})" for d in getattr(train_loader, "decisions", [])]
    tuned = getattr(train_loader, "tuning", None)
    return {"mode": mode, "wall_s": wall, "epoch_s": epoch_s, "step_s": step_s, "wait_s": wait_s,
            "decisions": decisions, "in_force": tuned.config.label() if tuned is not None else None,
            "bottleneck": tuned.bottleneck if tuned is not None else None,
            "val_in_force": val_loader.tuning.config.label() if hasattr(val_loader, "tuning") else None,
            "torch_threads": torch.get_num_threads()}


class _Take(torch.utils.data.Dataset):
    """The first ``n`` samples of ``dataset``."""

    def __init__(self, dataset: Any, n: int) -> None:
        self.dataset, self.n = dataset, n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> Any:
        return self.dataset[i]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("mode", help='"auto" (make_loader) or a fixed num_workers')
    parser.add_argument("--samples", type=int, default=1600)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--size", type=int, default=160, help="JPEG side in pixels")
    parser.add_argument("--crop", type=int, default=128)
    args = parser.parse_args()
    print(json.dumps(run(args.mode, samples=args.samples, epochs=args.epochs, size=args.size, crop=args.crop)))


if __name__ == "__main__":
    main()

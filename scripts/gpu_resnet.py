#!/usr/bin/env python
"""The tuned loader against the usual fixed rules with a real training step on a real GPU.

    PYTHONPATH=. python scripts/gpu_resnet.py                 # ResNet-18 and ResNet-50: a few minutes on an H200
    PYTHONPATH=. python scripts/gpu_resnet.py --models resnet18 --batches 40
    PYTHONPATH=. python scripts/gpu_resnet.py --cpu-dry-run   # the same code on the CPU, a tiny model, small sizes

Data: ``autotune``'s demo images at 96x96 (decoded, cropped, jittered and blurred per sample in numpy: about 2.5 ms of
one core each, measured on the H200 machine's CPUs).
Step: a torchvision ResNet forward/backward/SGD step under bf16 autocast, channels_last, queued asynchronously (the
loop never synchronises but for a loss read back every 10 batches, as a logging loop does).

For each model: ``make_loader(..., step=train_step, tuning="trials")`` (its trials are timed against the real step),
then the same training loop over ``--batches`` batches with the tuned loader and with plain DataLoaders at
``num_workers=0`` and the cores rule (usable CPUs - 1), pinned, copied with ``.to(device, non_blocking=True)``; then
the default ``make_loader`` (online tuning, no step given) whose first epoch trains while it tunes. Samples/s of the
loop (wall clock, the first 3 batches of each loop left out, a synchronize at the end) and each configuration.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from typing import Any, Callable, Dict, Iterable, List

import torch
from torch.utils.data import DataLoader

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from autoloader import make_loader, probe_machine  # noqa: E402
from autoloader.cli.demo import DemoImages, cores_rule_workers  # noqa: E402


def _model(name: str, device: torch.device) -> torch.nn.Module:
    if name == "tiny":
        model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.ReLU(),
                                    torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(8, 10))
    else:
        import torchvision
        model = getattr(torchvision.models, name)(weights=None, num_classes=10)
    return model.to(device, memory_format=torch.channels_last)


def _train_step(model: torch.nn.Module, device: torch.device) -> Callable[[Any], torch.Tensor]:
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    loss_fn = torch.nn.CrossEntropyLoss()
    autocast = torch.autocast(device.type, dtype=torch.bfloat16)

    def step(batch: Any) -> torch.Tensor:
        images, labels = batch
        images = images.to(device, non_blocking=True).contiguous(memory_format=torch.channels_last)
        labels = labels.to(device, non_blocking=True)
        with autocast:
            loss = loss_fn(model(images), labels)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return loss

    return step


def _loop(batches: Iterable[Any], step: Callable[[Any], torch.Tensor], *, limit: int, batch_size: int,
          device: torch.device) -> float:
    """Samples/s of ``limit`` training steps (the first 3 left out of the timing)."""
    start, done = 0.0, 0
    for index, batch in enumerate(batches):
        if index == 3:
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            start = time.perf_counter()
        loss = step(batch)
        if index % 10 == 9:
            loss.item()
        done = index + 1
        if done >= limit:
            break
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    if done < 4:
        raise RuntimeError(f"only {done} batches: pass a larger dataset or fewer --batches")
    return (done - 3) * batch_size / (time.perf_counter() - start)


def _trials_and_fixed(dataset: DemoImages, step: Callable[[Any], torch.Tensor], *, name: str, batch_size: int,
                      batches: int, budget: float, device: torch.device, rule: int) -> Dict[str, float]:
    """``make_loader`` with trials against ``step``, then the training loop with its loader and with plain ones."""
    began = time.perf_counter()
    tuned = make_loader(dataset, batch_size=batch_size, shuffle=True, drop_last=True, step=step,
                        tuning="trials", budget=budget, device=device, key=f"gpu_resnet-trials-{name}")
    tuning_s = time.perf_counter() - began
    result = tuned.tuning
    print(f"\n{name}: tuned {result.config.label()} in {tuning_s:.1f} s, {len(result.trials)} trials, "
          f"bottleneck {result.bottleneck}; trials:", flush=True)
    for trial in result.trials:
        print(f"    {trial.config.label():40s} {trial.status:8s} {trial.samples_per_s or 0:10,.0f} samples/s "
              f"startup {trial.startup_s or 0:5.2f} s  {trial.reason or ''}")
    rates = {"tuned (" + result.config.label() + ")":
             _loop(tuned, step, limit=batches, batch_size=batch_size, device=device)}
    del tuned
    for label, workers in (("num_workers=0", 0), (f"cores rule ({rule} workers)", rule)):
        plain = DataLoader(dataset, batch_size=batch_size, shuffle=True, drop_last=True, num_workers=workers,
                           pin_memory=device.type == "cuda", persistent_workers=False)
        rates[label] = _loop(plain, step, limit=batches, batch_size=batch_size, device=device)
        del plain
    return rates


def main(argv: List[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="resnet18,resnet50")
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--batches", type=int, default=60, help="timed training steps per configuration")
    parser.add_argument("--epoch-batches", type=int, default=None,
                        help="batches in an epoch of the online part (default 200; 24 in a dry run)")
    parser.add_argument("--budget", type=float, default=20.0, help="make_loader's trial budget, seconds")
    parser.add_argument("--online-only", action="store_true",
                        help="only the online part (and the cores rule over the same epochs)")
    parser.add_argument("--cpu-dry-run", action="store_true")
    args = parser.parse_args(argv)
    dry = args.cpu_dry_run or not torch.cuda.is_available()
    device = torch.device("cpu" if dry else "cuda")
    models = ["tiny"] if dry else args.models.split(",")
    batch_size = 16 if dry else args.batch_size
    batches = 12 if dry else args.batches
    epoch_batches = args.epoch_batches or (24 if dry else 200)
    os.environ.setdefault("AUTOLOADER_CACHE_DIR", tempfile.mkdtemp(prefix="gpu_resnet_cache_"))
    usable = probe_machine(disk=False).cpu.usable
    rule = cores_rule_workers(usable)
    dataset = DemoImages(batch_size * (batches + 8), size=32 if dry else 96)
    gpu = "cpu (dry run)" if dry else torch.cuda.get_device_name(device)
    print(f"gpu_resnet: torch {torch.__version__}, {gpu}, {usable} usable CPUs, batch {batch_size}, "
          f"{batches} timed steps per configuration", flush=True)
    for name in models:
        model = _model(name, device)
        step = _train_step(model, device)
        for _ in range(5):
            step((torch.zeros(batch_size, 3, dataset.size, dataset.size), torch.zeros(batch_size, dtype=torch.long)))
        rates: Dict[str, float] = {}
        if not args.online_only:
            rates.update(_trials_and_fixed(dataset, step, name=name, batch_size=batch_size, batches=batches,
                                           budget=args.budget, device=device, rule=rule))
        epoch = DemoImages(batch_size * epoch_batches, size=dataset.size)
        online = make_loader(epoch, batch_size=batch_size, shuffle=True, drop_last=True, device=device,
                             key=f"gpu_resnet-online-{name}")
        for number in (1, 2):
            label = f"online, epoch {number} of {len(online)} batches" + (" (tunes while it trains)" if number == 1
                                                                           else "")
            rates[label] = _loop(online, step, limit=len(online), batch_size=batch_size, device=device)
            spans = [(f"{start:.1f}-{end:.1f} s", label, round(rate or 0))
                     for start, end, label, rate in online.online_traces[-1].spans] if online.online_traces else []
            print(f"  online epoch {number}: {rates[label]:,.0f} samples/s; in force "
                  f"{online.tuning.config.label()}; decisions "
                  f"{[(d.epoch, d.config.label(), round(d.samples_per_s or 0)) for d in online.decisions]}; "
                  f"spans {spans}", flush=True)
        plain = DataLoader(epoch, batch_size=batch_size, shuffle=True, drop_last=True, num_workers=rule,
                           pin_memory=device.type == "cuda", persistent_workers=True)
        for number in (1, 2):
            rates[f"cores rule, epoch {number} of {len(plain)} batches"] = _loop(
                plain, step, limit=len(plain), batch_size=batch_size, device=device)
        del plain
        best = max(rates.values())
        for label, value in rates.items():
            print(f"  {label:45s} {value:10,.0f} samples/s  {value / best:5.2f} of the best")
        del online, model, step
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""What a new user sees on a dataset doing numpy BLAS per sample (issue 45, item 7): plain DataLoaders at 0, 1 and 2
workers against ``make_loader`` online (epochs 1-3) and trials (pre-pass + epoch 1), whole epochs of the same loop.

Needs only what the default install has (torch, numpy, autoloader), so it runs in a venv installed as the README
says, as a new user's would be:

    python3 -m venv /tmp/user && . /tmp/user/bin/activate && pip install torch==2.13.0 && pip install .
    python tests/benchmarks/blas_user.py                        # prints the rows, then one JSON line
    python tests/benchmarks/blas_user.py --hide-threadpoolctl   # as if threadpoolctl were not installed

``test_bench_native_threads.py`` runs the same rows under pytest (``blas_rows``). Each sample: three 320x320 float32
matmuls by numpy (``workloads.Matmul(size=320, rounds=3)``); batch 16, shuffled, no training step (the loader is the
bottleneck); epochs of ``--samples`` samples (default 2,400). Plain DataLoaders run in two interleaved rounds
(0, 1, 2, then 2, 1, 0) and the faster epoch of each counts.
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import tempfile
import time
from typing import Any, Dict, List, Optional, Tuple

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))  # tests/: workloads.py

BATCH = 16
PLAIN = (0, 1, 2)


def hide_threadpoolctl() -> None:
    """``import threadpoolctl`` raises ImportError from now on, here and in the workers forked later."""
    sys.modules["threadpoolctl"] = None  # type: ignore[assignment]


def threadpoolctl_installed() -> bool:
    try:
        import threadpoolctl  # noqa: F401
    except ImportError:
        return False
    return True


def epoch_s(loader: Any) -> Tuple[float, int]:
    started = time.perf_counter()
    samples = 0
    for batch in loader:
        samples += int(batch.shape[0])
    return time.perf_counter() - started, samples


def plain_rates(dataset: Any) -> Dict[int, float]:
    """Samples/s of a plain DataLoader's epoch per num_workers: the faster of two interleaved rounds."""
    from torch.utils.data import DataLoader

    best: Dict[int, float] = {}
    for workers in list(PLAIN) + list(reversed(PLAIN)):
        loader = DataLoader(dataset, BATCH, shuffle=True, num_workers=workers, prefetch_factor=2 if workers else None)
        wall, samples = epoch_s(loader)
        assert samples == len(dataset), (workers, samples)
        best[workers] = max(best.get(workers, 0.0), samples / wall)
        del loader
        gc.collect()
    return best


def _shut_down(loader: Any) -> None:
    del loader
    gc.collect()


def online_rates(dataset: Any, cache: str, epochs: int = 3) -> Tuple[List[float], List[str], str]:
    """make_loader(tuning="online"): samples/s of each epoch (the call's own time in epoch 1), the configuration in
    force after each, and its report after the last."""
    import torch
    from autoloader import make_loader

    torch.manual_seed(0)
    started = time.perf_counter()
    loader = make_loader(dataset, BATCH, shuffle=True, tuning="online", cache=cache)
    made = time.perf_counter() - started
    rates, configs = [], []
    for epoch in range(epochs):
        wall, samples = epoch_s(loader)
        assert samples == len(dataset), (epoch, samples)
        rates.append(samples / (wall + (made if epoch == 0 else 0.0)))
        configs.append(loader.tuning.config.label())
    report = str(loader.tuning)
    _shut_down(loader)
    return rates, configs, report


def trials_rates(dataset: Any, cache: str) -> Tuple[float, float, str, str]:
    """make_loader(tuning="trials"): its pre-pass seconds, epoch 1's samples/s, its choice and its report."""
    import torch
    from autoloader import make_loader

    torch.manual_seed(0)
    started = time.perf_counter()
    loader = make_loader(dataset, BATCH, shuffle=True, tuning="trials", cache=cache)
    prepass = time.perf_counter() - started
    wall, samples = epoch_s(loader)
    assert samples == len(dataset), samples
    out = (prepass, samples / wall, loader.tuning.config.label(), str(loader.tuning))
    _shut_down(loader)
    return out


def blas_rows(samples: int = 2400) -> Dict[str, Any]:
    """Every row, measured in this process as it is (hide threadpoolctl first for the install without it)."""
    import numpy as np
    import torch
    from workloads import Matmul

    dataset = Matmul(n=samples, size=320, rounds=3, backend="numpy")
    plain = plain_rates(dataset)
    with tempfile.TemporaryDirectory(prefix="autoloader-blas-") as tmp:
        online, configs, online_report = online_rates(dataset, os.path.join(tmp, "online"))
        prepass, trials, trials_config, trials_report = trials_rates(dataset, os.path.join(tmp, "trials"))
    best_plain = max(plain.values())
    return {"threadpoolctl": threadpoolctl_installed(), "samples": samples, "torch": torch.__version__,
            "numpy": np.__version__, "plain": plain, "best_plain": best_plain,
            "online": online, "online_configs": configs, "online_report": online_report,
            "trials_prepass_s": prepass, "trials": trials, "trials_config": trials_config,
            "trials_report": trials_report,
            "online/plain": [r / best_plain for r in online], "trials/plain": trials / best_plain}


def summary(row: Dict[str, Any]) -> str:
    plain = ", ".join(f"{w} workers {r:,.0f}" for w, r in sorted(row["plain"].items()))
    online = ", ".join(f"e{i + 1} {r:,.0f} ({q:.2f})" for i, (r, q) in enumerate(zip(row["online"],
                                                                                    row["online/plain"])))
    return (f"threadpoolctl {'installed' if row['threadpoolctl'] else 'NOT installed'}: plain {plain} samples/s; "
            f"online {online}, in force {' / '.join(row['online_configs'])}; trials {row['trials_config']}: pre-pass "
            f"{row['trials_prepass_s']:.1f} s, e1 {row['trials']:,.0f} ({row['trials/plain']:.2f})")


def main(argv: Optional[List[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hide-threadpoolctl", action="store_true")
    parser.add_argument("--samples", type=int, default=2400)
    args = parser.parse_args(argv)
    if args.hide_threadpoolctl:
        hide_threadpoolctl()
    row = blas_rows(args.samples)
    print(summary(row))
    print("\nonline report after epoch 3:\n" + row["online_report"])
    print("\ntrials report:\n" + row["trials_report"])
    print(json.dumps({k: v for k, v in row.items() if not k.endswith("_report")}))


if __name__ == "__main__":
    main()

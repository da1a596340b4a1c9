"""One stress scenario in a fresh interpreter (tests/stress/test_stress.py runs it hundreds of times).

    python tests/stress/scenario.py {killed,raising,hanging,interrupt,online-killed,online-interrupt}

Prints one JSON line: the outcome and what make_loader returned or raised. For the interrupt scenarios the parent
sends SIGINT at a random moment; the script prints ``started`` first so the parent knows tuning has begun. The trial
scenarios tune with trials (``tuning="trials"``); the online ones run epochs of a loader tuned online.
"""
from __future__ import annotations

import json
import os
import signal
import sys
import time
import warnings

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.dirname(os.path.dirname(HERE)), os.path.dirname(HERE)]

import fault_data as fd  # noqa: E402
import online_data  # noqa: E402
import workloads  # noqa: E402
from autoloader import make_loader  # noqa: E402


def main(scenario: str) -> dict:
    signal.signal(signal.SIGINT, signal.default_int_handler)  # as an interactive run, whatever was inherited
    warnings.simplefilter("ignore")
    common = dict(batch_size=4, cache=False, tuning="trials")
    if scenario == "killed":
        loader = make_loader(fd.KillWorkers(from_workers=1), budget=4, max_workers=4, **common)
        return {"workers": loader.tuning.num_workers, "source": loader.tuning.source}
    if scenario == "raising":
        try:
            make_loader(fd.Raising("workers"), budget=4, max_workers=4, **common)
        except fd.CorruptSample as err:
            return {"raised": type(err).__name__}
        return {"raised": None}
    if scenario == "hanging":
        loader = make_loader(fd.Hang("workers", hang_s=60), budget=2, max_workers=4, **common)
        return {"workers": loader.tuning.num_workers, "source": loader.tuning.source}
    if scenario == "interrupt":
        print("started", flush=True)
        try:
            make_loader(workloads.LatencyBound(latency_s=0.004), budget=20, max_workers=64, **common)
        except KeyboardInterrupt:
            return {"interrupted": time.monotonic()}
        return {"interrupted": None, "returned": time.monotonic()}
    if scenario == "online-killed":
        loader = make_loader(online_data.KilledFromWorkers(600, from_workers=2), batch_size=4, cache=False,
                             tuning="online", max_workers=4)
        seen = sorted(int(i) for _ in range(3) for batch in loader for i in batch.view(-1))
        return {"every_sample_thrice": seen == sorted(list(range(600)) * 3),
                "failed": sum(t.status == "failed" for t in loader.tuning.trials)}
    if scenario == "online-interrupt":
        loader = make_loader(workloads.LatencyBound(n=20000, latency_s=0.004), batch_size=4, cache=False,
                             tuning="online", max_workers=64)
        print("started", flush=True)
        try:
            for _ in range(2):
                for _batch in loader:
                    pass
        except KeyboardInterrupt:
            return {"interrupted": time.monotonic()}
        return {"interrupted": None, "returned": time.monotonic()}
    raise SystemExit(f"unknown scenario {scenario!r}")


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1])), flush=True)

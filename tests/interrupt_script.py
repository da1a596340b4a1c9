"""Ctrl-C at one point of a candidate's life (tests/measure/test_interrupt.py runs it in its own process).

argv: mode (trials|online), point (create|fork|first|window|switch). A profile hook sends SIGINT to this process the
first time that point is reached; the script prints one JSON line: what was raised, how long after the signal, and the
children still alive 3 s later.
"""
import json
import os
import signal
import sys
import time

import multiprocessing.process
import psutil
import torch
from torch.utils.data import Dataset

import autoloader.measure.run as run_module
import autoloader.measure.window as window_module

MODE, POINT = sys.argv[1], sys.argv[2]
sent = {}
starts = []


class Slow(Dataset):
    """160 ms batches: online, the prior's workers start inside the first batch (``online_policy.starts_early``)."""

    def __len__(self):
        return 3000

    def __getitem__(self, i):
        time.sleep(0.01)
        return torch.full((4,), float(i))


def candidate_of_interest(run) -> bool:
    return run.config.num_workers > 0 and run.mode != "serve"


def should_fire(frame, event) -> bool:
    code = frame.f_code
    if event != "call":
        return False
    if POINT == "create":
        return code.co_name == "__init__" and code.co_filename.endswith("dataloader.py") and \
            type(frame.f_locals.get("self")).__name__ == "_MultiProcessingDataLoaderIter"
    if POINT == "fork":  # the third worker of the first worker candidate starts: its iterator is half built
        if code is multiprocessing.process.BaseProcess.start.__code__:
            starts.append(1)
        return len(starts) == 3
    if POINT == "first":
        return code.co_name == "_next_data" and code.co_filename.endswith("dataloader.py") and \
            type(frame.f_locals.get("self")).__name__ == "_MultiProcessingDataLoaderIter"
    if POINT == "window":
        window = frame.f_locals.get("self")
        return code is window_module.Window.add.__code__ and window.config.num_workers > 0 and \
            len(window.marks) > window.skip + 2
    if POINT == "switch":
        run = frame.f_locals.get("self")
        return code is run_module.Run.stop.__code__ and candidate_of_interest(run)
    raise SystemExit(f"unknown point {POINT}")


def hook(frame, event, arg):
    if not sent and should_fire(frame, event):
        sent["at"] = time.perf_counter()
        os.kill(os.getpid(), signal.SIGINT)


def main() -> None:
    signal.signal(signal.SIGINT, signal.default_int_handler)  # as an interactive run, whatever was inherited
    from autoloader import make_loader
    outcome = {"raised": None}
    sys.setprofile(hook)
    try:
        if MODE == "trials":
            make_loader(Slow(), 16, tuning="trials", cache=False, budget=6)
        else:
            loader = make_loader(Slow(), 16, tuning="online", cache=False)
            for _ in range(3):
                for _batch in loader:
                    pass
    except KeyboardInterrupt:
        outcome["raised"] = "KeyboardInterrupt"
    finally:
        sys.setprofile(None)
    outcome["after_s"] = None if not sent else time.perf_counter() - sent["at"]
    outcome["fired"] = bool(sent)
    deadline = time.monotonic() + 3.0
    children = psutil.Process().children(recursive=True)
    while children and time.monotonic() < deadline:
        time.sleep(0.05)
        children = [c for c in children if c.is_running() and c.status() != psutil.STATUS_ZOMBIE]
    outcome["children"] = [c.pid for c in children]
    print(json.dumps(outcome), flush=True)


main()

"""Ctrl-C at one point of a candidate's life (tests/measure/test_interrupt.py runs it in its own process).

argv: mode (trials|online), point (create|fork|first|window|switch). A profile hook sends SIGINT to this process the
first time that point is reached; the script prints one JSON line: what was raised, how long after the signal, and the
children still alive 3 s later.
"""
import json
import signal
import sys
import time

import psutil
import torch
from torch.utils.data import Dataset

from interrupt_hook import arm, hook, sent

MODE, POINT = sys.argv[1], sys.argv[2]


class Slow(Dataset):
    """160 ms batches: online, the prior's workers start inside the first batch (``online_policy.starts_early``)."""

    def __len__(self):
        return 3000

    def __getitem__(self, i):
        time.sleep(0.01)
        return torch.full((4,), float(i))


def main() -> None:
    signal.signal(signal.SIGINT, signal.default_int_handler)  # as an interactive run, whatever was inherited
    from autoloader import make_loader
    outcome = {"raised": None}
    arm(POINT)
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

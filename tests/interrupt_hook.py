"""The profile hook of ``interrupt_script.py``: it sends SIGINT to the process the first time a point of a candidate's
life is reached (``arm``, then ``sys.setprofile(hook)``).

The hook is instrumentation, not the program under test: a signal handler that runs while it does must not raise in
its frames (a retry of a kept Ctrl-C landing in ``should_fire`` raised there and left a finalizer of multiprocessing
half made, which Python then reported as "Exception ignored"). So its frames are marked as a signal handler's are
(``unsafe.handlers_in``): what lands in them is kept and raised in the program's own frames, where it would have
landed without the hook (NOTE [ Asynchronous exceptions ] in autoloader/supervise/signals.py).
"""
import os
import signal
import time

import multiprocessing.process

import autoloader.measure.run as run_module
import autoloader.measure.window as window_module
from autoloader.supervise.unsafe import handlers_in

handlers_in(__name__)

POINT = ""
sent = {}
starts = []


def arm(point: str) -> None:
    """Fire at ``point`` (create|fork|first|window|switch)."""
    global POINT
    POINT = point


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

"""The fault suite, hundreds of times, each run in a fresh interpreter: zero hangs, nothing left behind.

Not in the default run (``--stress``). Each scenario is a real make_loader call (tests/stress/scenario.py): every
worker SIGKILLed on its first sample, a dataset that raises in workers, one that blocks in workers, Ctrl-C (SIGINT)
at a random moment of a tuning that climbs to 64 workers; and the same faults tuning online, inside the epochs:
workers killed while they serve a candidate (every sample must still come once per epoch), Ctrl-C at a random moment
of the first epochs. A run that outlives its limit is a hang; a run whose session still holds a process after it
exits left something behind.

    python -m pytest tests/stress --stress -s          # 240 runs, about 10 minutes on 2 cores

``AUTOLOADER_STRESS_RUNS`` sets the runs per scenario (default 40, six scenarios).
"""
from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import psutil
import pytest

pytestmark = pytest.mark.stress

SCRIPT = Path(__file__).resolve().parent / "scenario.py"
RUNS = int(os.environ.get("AUTOLOADER_STRESS_RUNS", "40"))
LIMIT_S = {"killed": 60, "raising": 60, "hanging": 60, "interrupt": 60, "online-killed": 90, "online-interrupt": 60}
INTERRUPTS = ("interrupt", "online-interrupt")
INTERRUPT_WITHIN_S = 2.0


def _leftovers(session: int) -> list:
    left = []
    for proc in psutil.process_iter(["pid"]):
        try:
            if os.getsid(proc.pid) == session and proc.status() != psutil.STATUS_ZOMBIE:
                left.append(proc.pid)
        except (ProcessLookupError, PermissionError, psutil.Error):
            continue
    return left


def _stacks(pid: int) -> str:
    """Every thread's stack of a hung run and of its first children, by py-spy when it is installed (``pip install
    py-spy``): a hang is diagnosed from them, not guessed."""
    spy = shutil.which("py-spy") or shutil.which("py-spy", path=os.path.dirname(sys.executable))
    if spy is None:
        return "(no stacks: pip install py-spy to have them)"
    try:
        pids = [pid] + [child.pid for child in psutil.Process(pid).children(recursive=True)][:4]
    except psutil.Error:
        pids = [pid]
    dumps = []
    for each in pids:
        try:
            dumped = subprocess.run([spy, "dump", "--pid", str(each)], capture_output=True, text=True, timeout=30)
            dumps.append(f"--- pid {each}\n{dumped.stdout}{dumped.stderr}")
        except subprocess.TimeoutExpired:
            dumps.append(f"--- pid {each}: py-spy did not answer within 30 s")
    return "\n".join(dumps)


def _keyboard_interrupt_only(stderr: str) -> bool:
    """A run that exited on the Ctrl-C (outside the scenario's ``try``: before it, or as the interpreter exits) shows
    its ``KeyboardInterrupt``, and no worker's death raised in its place."""
    lines = stderr.splitlines()
    return any(line.startswith("KeyboardInterrupt") for line in lines) and \
        not any("DataLoader worker" in line for line in lines)


def _run(scenario: str, seed: int) -> dict:
    """One run in a new session; SIGINT at a random moment for ``interrupt``."""
    started = time.monotonic()
    proc = subprocess.Popen([sys.executable, str(SCRIPT), scenario], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)
    signalled = None
    try:
        if scenario in INTERRUPTS:
            proc.stdout.readline()  # "started": the imports are done, tuning begins
            time.sleep(random.Random(seed).uniform(0.0, 8.0))
            signalled = time.monotonic()
            proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=LIMIT_S[scenario])
    except subprocess.TimeoutExpired:
        stacks = _stacks(proc.pid)
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        return {"scenario": scenario, "hang": True, "seconds": time.monotonic() - started, "stacks": stacks}
    ended = time.monotonic()
    lines = [line for line in out.splitlines() if line.startswith("{")]
    result = json.loads(lines[-1]) if lines else {}
    left = _leftovers(proc.pid)
    if left:
        os.killpg(proc.pid, signal.SIGKILL)
    caught = result.get("interrupted")
    return {"scenario": scenario, "hang": False, "rc": proc.returncode, "result": result, "left": left,
            "seconds": ended - started, "after_signal": None if signalled is None else ended - signalled,
            "caught_after": None if signalled is None or not caught else caught - signalled, "signalled": signalled,
            "stderr": err[-2000:] if proc.returncode or scenario in INTERRUPTS else ""}  # a lost Ctrl-C's too


def test_no_hang_in_hundreds_of_fault_runs():
    jobs = [(scenario, seed) for seed in range(RUNS) for scenario in LIMIT_S]
    with ThreadPoolExecutor(max_workers=2) as pool:
        runs = list(pool.map(lambda job: _run(*job), jobs))
    by = {s: [r for r in runs if r["scenario"] == s] for s in LIMIT_S}
    lines = []
    for scenario, rs in by.items():
        done = [r for r in rs if not r["hang"]]
        seconds = sorted(r["seconds"] for r in rs)
        line = (f"{scenario:10s} runs {len(rs):4d}  hangs {sum(r['hang'] for r in rs)}  "
                f"left behind {sum(bool(r.get('left')) for r in done)}  "
                f"seconds median {seconds[len(rs) // 2]:.1f} max {seconds[-1]:.1f}")
        after = [r["after_signal"] for r in done if r.get("after_signal") is not None]
        if after:
            caught = [r["caught_after"] for r in done if r.get("caught_after") is not None]
            line += (f"  Ctrl-C to exit: median {sorted(after)[len(after) // 2]:.2f} s, worst {max(after):.2f} s"
                     f" (KeyboardInterrupt out of make_loader: worst {max(caught, default=float('nan')):.2f} s)")
        lines.append(line)
    print("\n" + "\n".join(lines))
    hung = [r for r in runs if r["hang"]]
    assert not hung, "\n".join(lines + [f"{r['scenario']} hung; its stacks:\n{r['stacks']}" for r in hung[:2]])
    assert not [r for r in runs if r.get("left")], [r for r in runs if r.get("left")][:3]
    bad = [r for r in runs if not r["hang"] and r["rc"] != 0 and r["scenario"] not in INTERRUPTS]
    if bad:
        pytest.fail(f"{len(bad)} runs failed; the first: {bad[0]['scenario']}, rc {bad[0]['rc']}:\n{bad[0]['stderr']}")
    assert all(r["result"].get("workers") == 0 and r["result"].get("source") == "tuned"
               for r in by["killed"]), [r["result"] for r in by["killed"]][:5]
    assert all(r["result"].get("raised") == "CorruptSample" for r in by["raising"])
    assert all(r["result"].get("workers") == 0 for r in by["hanging"])
    assert all(r["result"].get("every_sample_thrice") for r in by["online-killed"]), \
        [r["result"] for r in by["online-killed"]][:5]
    assert any(r["result"].get("failed") for r in by["online-killed"]), "no candidate's workers died in any run"
    lost = [r for s in INTERRUPTS for r in by[s] if not r["hang"] and r["result"].get("returned", 0.0) > r["signalled"]]
    assert not lost, f"{len(lost)} Ctrl-C(s) lost: the loop went on and returned normally, {lost[:2]}"
    # A Ctrl-C sent once the scenario had returned lands in the interpreter's exit: SIGINT's default disposition is
    # back by then, and the process ends with -2 and nothing on stderr (4 of 6 by hand, 2026-12-04). Not ours to judge.
    late = [r for s in INTERRUPTS for r in by[s] if not r["hang"] and r["result"].get("returned") is not None
            and r["result"]["returned"] <= r["signalled"]]
    print(f"Ctrl-Cs sent after the scenario had returned: {len(late)}")
    interrupted = [r for s in INTERRUPTS for r in by[s]
                   if (r["result"].get("interrupted") or r["rc"] != 0) and r not in late]
    assert interrupted, "no Ctrl-C landed during tuning"
    other = [r for r in interrupted if r["rc"] != 0 and not _keyboard_interrupt_only(r["stderr"])]
    assert not other, (f"{len(other)} Ctrl-C(s) ended in another error; the first (rc {other[0]['rc']}, result "
                       f"{other[0]['result']}, signalled at {other[0]['signalled']}):\n{other[0]['stderr']}")
    slow = [r["after_signal"] for r in interrupted if r["after_signal"] > INTERRUPT_WITHIN_S]
    assert not slow, f"Ctrl-C took longer than {INTERRUPT_WITHIN_S} s to end the process: {sorted(slow)}"

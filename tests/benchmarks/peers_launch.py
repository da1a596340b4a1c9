"""Runs ``peers_run.py`` for ``test_bench_peers.py``: one contender run in a process of its own, its result parsed."""
from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Dict

import psutil

HERE = Path(__file__).resolve().parent
RESULT = "PEERS_RESULT "


def _autoloader_root() -> str:
    """The folder holding the autoloader this process imports, so the runs import the same one."""
    spec = importlib.util.find_spec("autoloader")
    assert spec is not None and spec.submodule_search_locations, "autoloader is not importable"
    return str(Path(list(spec.submodule_search_locations)[0]).parent)


def _kill_tree(pid: int) -> None:
    try:
        root = psutil.Process(pid)
        procs = root.children(recursive=True) + [root]
    except psutil.Error:
        return
    for proc in procs:
        try:
            proc.kill()
        except psutil.Error:
            continue


def launch(spec: Dict[str, Any]) -> Dict[str, Any]:
    """The run's result; ``status`` "failed" with the reason when it crashed, printed no result or timed out (its
    process tree is then killed)."""
    path = [str(HERE), str(HERE.parent), _autoloader_root()]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(path + [p for p in [os.environ.get("PYTHONPATH")] if p]),
               TF_CPP_MIN_LOG_LEVEL="2")
    proc = subprocess.Popen([sys.executable, str(HERE / "peers_run.py"), json.dumps(spec)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)
    try:
        out, err = proc.communicate(timeout=spec["timeout_s"])
    except subprocess.TimeoutExpired:
        _kill_tree(proc.pid)
        out, err = proc.communicate()
        return {"status": "failed", "reason": f"timed out after {spec['timeout_s']:.0f} s", "trace": err[-3000:],
                "left": []}
    for line in reversed(out.splitlines()):
        if line.startswith(RESULT):
            return json.loads(line[len(RESULT):])
    return {"status": "failed", "reason": f"no result (exit status {proc.returncode})", "trace": err[-3000:],
            "left": []}

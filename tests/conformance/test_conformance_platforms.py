"""macOS and Windows, as far as Linux can stand in for them: their default start method is ``spawn`` (every worker
a fresh interpreter that unpickles the dataset), which ``torch.multiprocessing.set_start_method("spawn")`` makes the
default here. make_loader is then run as a user there meets it, tuned online, against a plain DataLoader, with
``max_workers=4`` as the README advises under spawn: the online search prices a worker's start as a fork's, and a
spawned worker imports torch afresh (without a cap, this waiting-bound dataset's first epoch starts dozens of them). What Linux cannot stand in for (no ``/dev/shm``, no cgroups, macOS's and Windows' own process and
memory accounting) is untested (README "Install")."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch
from torch.utils.data import Dataset, get_worker_info

from helpers import REPO, TESTS


IN_PARENT = False
"""Set True by the process that makes the loaders: a forked worker inherits it, a spawned one imports this module
afresh and reads False."""


class Waiting(Dataset):
    """Sample ``i`` waits 3 ms (a read from storage), then is ``[i, spawned]``: 1 when a spawned worker loaded it."""

    def __len__(self) -> int:
        return 960

    def __getitem__(self, i: int) -> torch.Tensor:
        time.sleep(0.003)
        spawned = get_worker_info() is not None and not IN_PARENT
        return torch.tensor([i, int(spawned)])


_SPAWN_DEFAULT = textwrap.dedent("""
    import json, sys, warnings
    warnings.simplefilter("ignore")
    import torch
    sys.path[:0] = sys.argv[1:]
    from torch.utils.data import DataLoader
    from autoloader import make_loader
    import test_conformance_platforms
    from test_conformance_platforms import Waiting
    if __name__ == "__main__":
        test_conformance_platforms.IN_PARENT = True
        torch.multiprocessing.set_start_method("spawn", force=True)   # what macOS and Windows default to
        runs = {}
        for name, build in (("theirs", lambda: DataLoader(Waiting(), batch_size=8, shuffle=True)),
                            ("ours", lambda: make_loader(Waiting(), batch_size=8, shuffle=True, cache=False, max_workers=4))):
            torch.manual_seed(3)
            loader, epochs = build(), []
            for epoch in range(2):
                epochs.append([batch.tolist() for batch in loader])
            runs[name] = (loader, epochs)
        order = lambda epochs: [[row[0] for row in batch] for epoch in epochs for batch in epoch]
        loader, ours = runs["ours"]
        print(json.dumps({"same": order(ours) == order(runs["theirs"][1]),
                          "spawned": sum(row[1] for epoch in ours for batch in epoch for row in batch),
                          "samples": sum(len(batch) for epoch in ours for batch in epoch),
                          "source": loader.tuning.source, "workers": loader.tuning.config.num_workers}))
""")


@pytest.mark.slow
def test_spawn_as_the_default_start_method_tunes_online_and_yields_dataloaders_batches():
    """Under ``spawn`` (in a subprocess: it sets the start method for the whole interpreter), the online search starts
    spawned workers, which load most of the epochs, and the epochs are a plain DataLoader's (same samples, order and
    batch boundaries)."""
    here = str(Path(__file__).resolve().parent)
    out = subprocess.run([sys.executable, "-c", _SPAWN_DEFAULT, here, str(TESTS), str(REPO)], capture_output=True,
                         text=True, timeout=300, env=dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1"))
    assert out.returncode == 0, out.stderr[-3000:]
    found = json.loads(out.stdout.strip().splitlines()[-1])
    assert found["same"] and found["samples"] == 2 * 960, found
    assert found["source"] == "online" and found["workers"] > 0 and found["spawned"] > 0, found

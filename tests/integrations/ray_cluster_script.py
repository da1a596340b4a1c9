"""A two-node Ray cluster on one machine (``ray.cluster_utils.Cluster``: a head with no CPU, where the step runs, and
a CPU node, where the tasks run), a loader of engine='ray' joining it by address: writes what it saw to
``OUT/report.json``. Run by test_ray_cluster.py."""
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

import torch
from torch.utils.data import DataLoader

from _helpers import arm_watchdog

arm_watchdog()
os.environ["PYTHONPATH"] = os.pathsep.join(sys.path[:4] + [os.environ.get("PYTHONPATH", "")])  # the nodes' workers
out = Path(sys.argv[1])
temp = tempfile.mkdtemp(prefix="al-rc-", dir="/tmp")
from ray.cluster_utils import Cluster  # noqa: E402

import autoloader.ray  # noqa: E402
from autoloader import make_loader  # noqa: E402
from ray_data import Where  # noqa: E402

cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 0, "temp_dir": temp, "include_dashboard": False})
try:
    worker = cluster.add_node(num_cpus=2)
    cluster.wait_for_nodes()
    dataset = Where(48)
    loader = make_loader(dataset, 4, shuffle=True, engine="ray", address=cluster.address, cache=str(out / "cache"),
                         budget=4.0, step=0.002)
    torch.manual_seed(3)
    epochs = [[(b[1].tolist(), list(b[2])) for b in loader] for _ in range(2)]
    torch.manual_seed(3)
    plain = DataLoader(dataset, 4, shuffle=True)
    want = [[b[1].tolist() for b in plain] for _ in range(2)]
    report = {"exact": [[ids for ids, _ in e] for e in epochs] == want,
              "nodes": sorted({n for e in epochs for _, nodes in e for n in nodes}),
              "worker": worker.node_id, "head": cluster.head_node.node_id, "tuning": loader.tuning.to_dict(),
              "batches": [len(e) for e in epochs]}
    autoloader.ray.shutdown()
    again = make_loader(dataset, 4, shuffle=True, engine="ray", address=cluster.address,
                        cache=str(out / "cache"), budget=4.0, step=0.002)
    report["second_source"] = again.tuning.source
    autoloader.ray.shutdown()
finally:
    cluster.shutdown()
    shutil.rmtree(temp, ignore_errors=True)
(out / "report.json").write_text(json.dumps(report))
print("temp", temp)

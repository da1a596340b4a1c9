"""A Ray cluster on one machine (``ray.cluster_utils.Cluster``: a head with no CPU, where the step runs, and CPU nodes,
each a raylet of its own on loopback), loaders of engine='ray' joining it by address: writes what it saw to
``OUT/report.json``. Run by test_ray_cluster.py. In order:

1. the head alone, no CPU: ``timeout=2`` gives up waiting for a CPU node, naming ``waits.NODES``; without it,
   make_loader waits until a node of 2 CPUs joins 3 s later (added by this thread: Ray's processes die with the
   thread that started them), then tunes, and the tasks run on that node, exact;
2. the decision cached under the cluster's shape;
3. a second CPU node that dies (removed, its raylet killed) in the middle of an epoch of six tasks: the tasks it ran
   are retried on the other node, and the epoch is exact;
4. a dataset whose module the nodes cannot import: ``MissingModule`` naming it, then ``runtime_env={"py_modules":
   [...]}`` ships it and the epoch is exact."""
import json
import os
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path

import torch
from torch.utils.data import DataLoader

from _helpers import arm_watchdog

arm_watchdog(200)
os.environ["PYTHONPATH"] = os.pathsep.join(sys.path[:4] + [os.environ.get("PYTHONPATH", "")])  # the nodes' workers
out = Path(sys.argv[1])
temp = tempfile.mkdtemp(prefix="al-rc-", dir="/tmp")
from ray.cluster_utils import Cluster  # noqa: E402

import autoloader.ray  # noqa: E402
from autoloader import make_loader  # noqa: E402
from autoloader.ray import make  # noqa: E402
from autoloader.ray.records import RayConfig, RayTuning  # noqa: E402
from autoloader.ray.work import MissingModule  # noqa: E402
from ray_data import Where  # noqa: E402

report: dict = {}


class SlowWhere(Where):
    """Where's samples, 0.15 s each in the workers: an epoch long enough for a node to die in its middle."""

    def __getitem__(self, index: int):
        if os.getpid() != self.driver:
            time.sleep(0.15)
        return super().__getitem__(index)


def fixed(config):
    """make_loader's search replaced by ``config`` (restored by the returned function)."""
    decide = make._decide
    make._decide = lambda request, arguments, source, shape, *, timeout: (RayTuning(config, None, "fixed", shape),
                                                                         None)
    return lambda: setattr(make, "_decide", decide)


def ids(loader, epochs=1):
    return [[b[1].tolist() for b in loader] for _ in range(epochs)]


cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 0, "temp_dir": temp, "include_dashboard": False})
try:
    dataset = Where(48)
    started = time.monotonic()
    try:
        make_loader(dataset, 4, engine="ray", address=cluster.address, timeout=2, cache=False)
    except TimeoutError as err:
        report["no_cpu"] = [str(err), round(time.monotonic() - started, 1)]
    autoloader.ray.shutdown()
    made: dict = {}

    def build():
        began = time.monotonic()
        try:
            made["loader"] = make_loader(dataset, 4, shuffle=True, engine="ray", address=cluster.address,
                                         cache=str(out / "cache"), budget=4.0, step=0.002)
        except BaseException as err:  # reported below
            made["error"] = repr(err)
        made["seconds"] = time.monotonic() - began

    builder = threading.Thread(target=build)
    builder.start()
    time.sleep(3.0)
    worker = cluster.add_node(num_cpus=2)
    builder.join(150)
    report["waited_s"] = round(made.get("seconds", -1), 1)
    if "error" in made:
        raise RuntimeError(made["error"])
    loader = made["loader"]
    torch.manual_seed(3)
    epochs = [[(b[1].tolist(), list(b[2])) for b in loader] for _ in range(2)]
    torch.manual_seed(3)
    plain = DataLoader(dataset, 4, shuffle=True)
    want = [[b[1].tolist() for b in plain] for _ in range(2)]
    report.update({"exact": [[i for i, _ in e] for e in epochs] == want,
                   "nodes": sorted({n for e in epochs for _, nodes in e for n in nodes}),
                   "worker": worker.node_id, "head": cluster.head_node.node_id, "tuning": loader.tuning.to_dict(),
                   "batches": [len(e) for e in epochs]})
    autoloader.ray.shutdown()
    again = make_loader(dataset, 4, shuffle=True, engine="ray", address=cluster.address, cache=str(out / "cache"),
                        budget=4.0, step=0.002)
    report["second_source"] = again.tuning.source
    autoloader.ray.shutdown()

    doomed = cluster.add_node(num_cpus=2)
    cluster.wait_for_nodes()
    restore = fixed(RayConfig(4, batches_per_task=1, prefetch=4))
    slow = SlowWhere(64)
    loader = make_loader(slow, 4, engine="ray", address=cluster.address, cache=False)
    restore()
    got, nodes = [], []
    for batch in loader:
        got.append(batch[1].tolist())
        nodes.append(set(batch[2]))
        if len(got) == 3:
            cluster.remove_node(doomed, allow_graceful=False)  # preempted: its raylet and workers killed
    report["node_died"] = {"exact": got == ids(DataLoader(slow, 4))[0], "batches": len(got),
                           "doomed_loaded": any(doomed.node_id in n for n in nodes),
                           "doomed_after": any(doomed.node_id in n for n in nodes[8:])}
    autoloader.ray.shutdown()

    code = Path(tempfile.mkdtemp(prefix="al-mod-")) / "al_missing_module"
    code.mkdir()
    (code / "__init__.py").write_text("import torch\nfrom torch.utils.data import Dataset\n\n\nclass Tiny(Dataset):\n"
                                      "    def __len__(self):\n        return 12\n\n    def __getitem__(self, i):\n"
                                      "        return torch.zeros(2), i\n")
    sys.path.insert(0, str(code.parent))  # the driver imports it; the nodes' workers were started without it
    from al_missing_module import Tiny  # noqa: E402

    restore = fixed(RayConfig(2, batches_per_task=2, prefetch=2))
    try:
        missing = make_loader(Tiny(), 3, engine="ray", address=cluster.address, cache=False)
        try:
            ids(missing)
        except ImportError as err:
            report["missing"] = [isinstance(err, MissingModule), str(err)]
        autoloader.ray.shutdown()
        shipped = make_loader(Tiny(), 3, engine="ray", address=cluster.address, cache=False,
                              runtime_env={"py_modules": [str(code)]})
        report["shipped_exact"] = ids(shipped) == ids(DataLoader(Tiny(), 3))
        autoloader.ray.shutdown()
    finally:
        restore()
        shutil.rmtree(code.parent, ignore_errors=True)
finally:
    cluster.shutdown()
    shutil.rmtree(temp, ignore_errors=True)
(out / "report.json").write_text(json.dumps(report))
print("temp", temp)

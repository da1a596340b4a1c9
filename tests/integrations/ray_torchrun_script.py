"""One torchrun rank of engine='ray' on a running Ray cluster (``ray start``): every rank its own Ray driver,
sharded by autoloader's DistributedSampler. Writes ``OUT/rank{N}.json``. Run by test_ray_cluster.py."""
import os
import sys

import torch.distributed as dist
from torch.utils.data import DataLoader, DistributedSampler

from _helpers import arm_watchdog, write_report

arm_watchdog()
import autoloader.ray  # noqa: E402
from autoloader import make_loader  # noqa: E402
from ray_data import Indexed  # noqa: E402

out, address, cache = sys.argv[1:4]
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
dataset = Indexed(64)
loader = make_loader(dataset, 4, shuffle=True, drop_last=True, engine="ray", address=address, cache=cache,
                     budget=4.0, step=0.002)
epochs = []
for epoch in range(2):
    loader.set_epoch(epoch)
    epochs.append([i for batch in loader for i in batch[1].tolist()])
sampler = DistributedSampler(dataset, num_replicas=world, rank=rank, shuffle=True, seed=0, drop_last=True)
plain = DataLoader(dataset, 4, sampler=sampler, drop_last=True)
want = []
for epoch in range(2):
    sampler.set_epoch(epoch)
    want.append([i for batch in plain for i in batch[1].tolist()])
state = loader.state_dict()  # a collective: every rank's part
autoloader.ray.shutdown()
write_report(out, rank, {"epochs": epochs, "exact": epochs == want, "tuning": loader.tuning.to_dict(),
                         "world_size": world, "pid": os.getpid(), "state_ranks": len(state.get("per_rank", []))})
dist.destroy_process_group()

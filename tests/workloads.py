"""Small synthetic datasets for the tests and benchmarks, one per regime (module level: picklable under spawn)."""
import time

import numpy as np
import torch
from torch.utils.data import Dataset


class InMemory(Dataset):
    """Tensors already in memory: loading costs next to nothing, so worker processes only add IPC."""

    def __init__(self, n=20000, dim=16):
        self.data = torch.randn(n, dim)

    def __len__(self):
        return len(self.data)

    def __getitem__(self, i):
        return self.data[i]


class CpuBound(Dataset):
    """Per-sample compute (a stand-in for decode/augment): spins ``cost_s`` of CPU time in the calling thread."""

    def __init__(self, n=100000, cost_s=0.002, dim=16):
        self.n, self.cost_s, self.dim = n, cost_s, dim

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        start = time.thread_time()
        x = np.float32(i)
        while time.thread_time() - start < self.cost_s:
            x = x * np.float32(1.0000001) + np.float32(1e-7)
        return torch.full((self.dim,), float(x))


class LatencyBound(Dataset):
    """Per-sample waiting (a stand-in for network or slow storage): sleeps ``latency_s`` and uses no CPU."""

    def __init__(self, n=100000, latency_s=0.004, dim=16):
        self.n, self.latency_s, self.dim = n, latency_s, dim

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        time.sleep(self.latency_s)
        return torch.full((self.dim,), float(i))


class Mixed(Dataset):
    """Some waiting and some compute per sample."""

    def __init__(self, n=100000, latency_s=0.002, cost_s=0.001, dim=16):
        self.wait = LatencyBound(n, latency_s, dim)
        self.work = CpuBound(n, cost_s, dim)

    def __len__(self):
        return self.wait.n

    def __getitem__(self, i):
        self.wait[i]
        return self.work[i]

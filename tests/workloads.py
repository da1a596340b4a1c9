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


class JpegDecode(Dataset):
    """Real image decoding: JPEG bytes held in memory, decoded with Pillow, randomly cropped and flipped.

    Needs Pillow (``pip install pillow``); only the benchmarks use it.
    """

    def __init__(self, n=256, size=256, crop=224, quality=90, seed=0):
        import io

        from PIL import Image

        rng = np.random.default_rng(seed)
        self.crop = crop
        self.blobs = []
        base = np.linspace(0, 255, size, dtype=np.float32)
        for _ in range(n):
            noise = rng.normal(0, 25, (size, size, 3)).astype(np.float32)
            pixels = np.clip(base[None, :, None] * 0.6 + base[:, None, None] * 0.4 + noise, 0, 255).astype(np.uint8)
            buf = io.BytesIO()
            Image.fromarray(pixels).save(buf, format="JPEG", quality=quality)
            self.blobs.append(np.frombuffer(buf.getvalue(), dtype=np.uint8))

    def __len__(self):
        return len(self.blobs) * 64

    def __getitem__(self, i):
        import io

        from PIL import Image

        rng = np.random.default_rng(i)
        image = np.asarray(Image.open(io.BytesIO(self.blobs[i % len(self.blobs)].tobytes())).convert("RGB"))
        top, left = rng.integers(0, image.shape[0] - self.crop + 1, size=2)
        image = image[top:top + self.crop, left:left + self.crop]
        if rng.random() < 0.5:
            image = image[:, ::-1]
        return torch.from_numpy(np.ascontiguousarray(image)).permute(2, 0, 1), i % 10


class GilBound(Dataset):
    """Pure-Python work per sample (a Python loop, holding the GIL): ``cost_s`` of the calling thread's own CPU
    time, so threads of one process take turns and only processes run it in parallel."""

    def __init__(self, n=100000, cost_s=0.001, dim=16):
        self.n, self.cost_s, self.dim = n, cost_s, dim

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        start = time.thread_time()
        while time.thread_time() - start < self.cost_s:
            pass
        return torch.full((self.dim,), float(i))


class Matmul(Dataset):
    """Per sample, a 256x256 float32 matrix multiplied by itself ``rounds`` times (scaled in between): with
    ``backend="numpy"`` by numpy's BLAS (OpenBLAS or MKL, one thread per core unless limited), with ``"torch"`` by
    torch's own pool (torch sets it to 1 thread in DataLoader workers; the main process keeps all its cores)."""

    def __init__(self, n=100000, size=256, rounds=4, backend="numpy"):
        if backend not in ("numpy", "torch"):
            raise ValueError(f"backend must be 'numpy' or 'torch', got {backend!r}")
        self.n, self.size, self.rounds, self.backend = n, size, rounds, backend

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        a = np.random.default_rng(i).standard_normal((self.size, self.size), dtype=np.float32)
        if self.backend == "torch":
            t = torch.from_numpy(a)
            for _ in range(self.rounds):
                t = t @ t
                t = t / t.abs().max()
            return t[:4, :4].clone()
        for _ in range(self.rounds):
            a = a @ a
            a /= np.abs(a).max()
        return torch.from_numpy(a[:4, :4].copy())

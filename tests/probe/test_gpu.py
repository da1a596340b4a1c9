"""GPU discovery (autoloader.probe._gpu): the decision code, on CPU, with torch.cuda and subprocess faked."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest
import torch

from autoloader.probe import GpuInfo, _gpu

G = 1 << 30
M = 1 << 20


class _Props:
    def __init__(self, name, total_memory):
        self.name, self.total_memory = name, total_memory


def _forbid(name):
    def fail(*args, **kwargs):
        raise AssertionError(f"{name} must not be called")
    return fail


def test_gpus_in_process_when_cuda_is_already_initialised(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: _Props(f"GPU{i}", (i + 1) * G))
    monkeypatch.setattr(subprocess, "run", _forbid("subprocess.run"))
    assert _gpu.probe_gpus() == (GpuInfo(0, "GPU0", G), GpuInfo(1, "GPU1", 2 * G))


def test_gpus_none_without_a_cuda_build(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: False)
    monkeypatch.setattr(torch.backends.cuda, "is_built", lambda: False)
    monkeypatch.setattr(subprocess, "run", _forbid("subprocess.run"))
    assert _gpu.probe_gpus() == ()


def _fake_run(child=None, smi=None):
    """subprocess.run stand-in: ``child``/``smi`` are (returncode, stdout) or an exception to raise."""
    def run(argv, **kwargs):
        result = child if argv[0] == sys.executable else smi
        if isinstance(result, BaseException):
            raise result
        if result is None:
            raise AssertionError(f"unexpected command {argv}")
        return subprocess.CompletedProcess(argv, result[0], result[1], "boom")
    return run


@pytest.fixture
def cuda_build(monkeypatch):
    """Pretend torch has CUDA but nothing initialised it; in-process CUDA queries are forbidden."""
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: False)
    monkeypatch.setattr(torch.backends.cuda, "is_built", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_available", _forbid("torch.cuda.is_available in-process"))
    monkeypatch.setattr(torch.cuda, "device_count", _forbid("torch.cuda.device_count in-process"))
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)


def test_gpus_from_a_child_process(monkeypatch, cuda_build):
    out = "some warning\n" + json.dumps([{"index": 0, "name": "NVIDIA H200", "total_bytes": 140 * G}]) + "\n"
    monkeypatch.setattr(subprocess, "run", _fake_run(child=(0, out)))
    assert _gpu.probe_gpus() == (GpuInfo(0, "NVIDIA H200", 140 * G),)
    monkeypatch.setattr(subprocess, "run", _fake_run(child=(0, "[]\n")))
    assert _gpu.probe_gpus() == ()


@pytest.mark.parametrize("child", [(1, ""), (0, "not json"), (0, '{"a": 1}'),
                                   subprocess.TimeoutExpired("python", 60), OSError("no exec")])
def test_gpus_fall_back_to_nvidia_smi(monkeypatch, cuda_build, child):
    monkeypatch.setattr(shutil, "which", lambda name: "/usr/bin/nvidia-smi")
    monkeypatch.setattr(subprocess, "run", _fake_run(child=child, smi=(0, "NVIDIA H200, 143771, GPU-aaa\n")))
    assert _gpu.probe_gpus() == (GpuInfo(0, "NVIDIA H200", 143771 * M),)


def test_gpus_unknown_when_everything_fails(monkeypatch, cuda_build):
    monkeypatch.setattr(shutil, "which", lambda name: None)
    monkeypatch.setattr(subprocess, "run", _fake_run(child=(1, "")))
    assert _gpu.probe_gpus() is None
    monkeypatch.setattr(shutil, "which", lambda name: "/usr/bin/nvidia-smi")
    monkeypatch.setattr(subprocess, "run", _fake_run(child=(1, ""), smi=(9, "")))
    assert _gpu.probe_gpus() is None


def test_parse_nvidia_smi_and_visible_devices():
    text = "A100, 40960, GPU-aaa\nH100, 81559, GPU-bbb\nL4, 23034, GPU-ccc\n"
    a, h, l4 = GpuInfo(0, "A100", 40960 * M), GpuInfo(1, "H100", 81559 * M), GpuInfo(2, "L4", 23034 * M)
    assert _gpu.parse_nvidia_smi(text) == (a, h, l4)
    assert _gpu.parse_nvidia_smi(text, "2,0") == (GpuInfo(0, "L4", l4.total_bytes), GpuInfo(1, "A100", a.total_bytes))
    assert _gpu.parse_nvidia_smi(text, "GPU-bb") == (GpuInfo(0, "H100", h.total_bytes),)
    assert _gpu.parse_nvidia_smi(text, "0,7,1") == (a,)          # CUDA stops at the first invalid entry
    assert _gpu.parse_nvidia_smi(text, "") == ()
    assert _gpu.parse_nvidia_smi(text, "MIG-123") is None        # cannot map a MIG device: unknown
    assert _gpu.parse_nvidia_smi("H100, [N/A], GPU-x\n") is None
    assert _gpu.parse_nvidia_smi("") == ()

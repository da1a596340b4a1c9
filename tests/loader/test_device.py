"""autoloader/loader/device.py: the device named by the user resolved once (CUDA given its index), a wrong one
refused with the fix, and one side stream per CUDA device."""
from __future__ import annotations

import pytest
import torch

from autoloader.loader.device import release_cached, resolve_device, side_stream

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
no_cuda = pytest.mark.skipif(torch.cuda.is_available(), reason="checks the errors raised without CUDA")


@pytest.mark.parametrize("device", ["cpu", torch.device("cpu")])
def test_the_cpu_resolves_to_itself_and_has_no_side_stream(device):
    resolved = resolve_device(device)
    assert resolved == torch.device("cpu") and side_stream(resolved) is None
    release_cached(resolved)


def test_the_default_is_cuda_when_available_else_the_cpu():
    assert resolve_device(None).type == ("cuda" if torch.cuda.is_available() else "cpu")


@pytest.mark.parametrize("device, error, fix", [
    ("gpu0", ValueError, "use 'cpu', 'cuda' or 'cuda:N'"),
    (0, TypeError, "must be a str or torch.device"),
    ("meta", ValueError, "handles 'cpu' and 'cuda' devices"),
])
def test_a_wrong_device_is_refused_with_the_fix(device, error, fix):
    with pytest.raises(error, match=fix):
        resolve_device(device)


@no_cuda
def test_cuda_without_cuda_says_to_pass_the_cpu():
    for device in ("cuda", "cuda:0", torch.device("cuda", 1)):
        with pytest.raises(ValueError, match="pass device='cpu'"):
            resolve_device(device)


@pytest.mark.cuda
@cuda
def test_cuda_is_indexed_and_each_device_has_one_side_stream():
    resolved = resolve_device("cuda")
    assert resolved.index == torch.cuda.current_device()
    stream = side_stream(resolved)
    assert isinstance(stream, torch.cuda.Stream) and side_stream(torch.device("cuda", resolved.index)) is stream
    with pytest.raises(ValueError, match="CUDA device\\(s\\) are visible"):
        resolve_device(f"cuda:{torch.cuda.device_count()}")

"""Hugging Face ``datasets``: an Arrow dataset saved to disk and loaded back (memory-mapped), ``with_format("torch")``,
dict batches, ``normalize=``/``dtype=`` applied to ``input_key="pixels"``; in this process and on 2 ranks (torchrun).

Each epoch: every sample exactly once (across ranks), a new shuffle order; every rank: the same tuning; every batch:
pixels float32 and normalised, the other entries untouched.
"""
from __future__ import annotations

import gc

import numpy as np
import pytest

datasets = pytest.importorskip("datasets",
                               reason="Hugging Face datasets is not installed: pip install '.[integrations]'")

from _helpers import HERE, check_epochs, check_same_config, launch, read_reports, torchrun  # noqa: E402
from hf_datasets_script import EPOCHS, check_batch, hf_loader  # noqa: E402

N = 64


@pytest.fixture(scope="module")
def arrow_dir(tmp_path_factory):
    """``N`` rows {pixels: uint8 3x8x8 filled with idx % 256, label, idx}, saved as Arrow files."""
    path = tmp_path_factory.mktemp("hf") / "arrow"
    features = datasets.Features({"pixels": datasets.Array3D((3, 8, 8), "uint8"),
                                  "label": datasets.Value("int64"), "idx": datasets.Value("int64")})
    table = {"pixels": [np.full((3, 8, 8), i % 256, dtype=np.uint8) for i in range(N)],
             "label": [i % 10 for i in range(N)], "idx": list(range(N))}
    datasets.Dataset.from_dict(table, features=features).save_to_disk(str(path))
    return path


@pytest.mark.parametrize("tuning", ["trials", "online"])
def test_arrow_from_disk_dict_batches_normalised_one_process(arrow_dir, cache_dir, tuning):
    """``input_key`` reaches the trials (and the online candidates): dict batches are normalised everywhere."""
    loader = hf_loader(str(arrow_dir), str(cache_dir), tuning)
    try:
        assert loader.tuning.source == ("tuned" if tuning == "trials" else "pending"), loader.tuning
        epochs = []
        for epoch in range(EPOCHS):
            loader.set_epoch(epoch)
            seen = []
            for batch in loader:
                assert set(batch) == {"pixels", "label", "idx"}
                assert check_batch(batch), f"pixels not float32 and normalised: {batch['pixels'].dtype}"
                seen.extend(int(i) for i in batch["idx"])
            epochs.append(seen)
        check_epochs([epochs], N)
        if tuning == "trials":  # a second make_loader is a cache hit with the same config
            again = hf_loader(str(arrow_dir), str(cache_dir), tuning)
            assert again.tuning.source == "cache"
            assert again.tuning.config == loader.tuning.config
            del again
    finally:
        del loader
        gc.collect()


def test_arrow_from_disk_dict_batches_normalised_two_ranks(arrow_dir, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    output = launch(torchrun(HERE / "hf_datasets_script.py", str(arrow_dir), str(out), str(tmp_path / "cache")),
                    out_dir=out)
    reports = read_reports(out, 2, output)
    for report in reports:
        assert report["error"] is None, f"rank {report['rank']}: {report['error']}\n{report.get('traceback', '')}"
        assert report["sampler_is_distributed"], report["sampler"]
        assert report["batches_ok"], "pixels not float32 and normalised"
    check_same_config([r["tuning"] for r in reports])
    check_epochs([r["epochs"] for r in reports], N)

"""The README's integration recipes (Lightning, Accelerate, Hugging Face ``datasets``, WebDataset, Ray Data), executed as
written with the real libraries (tests/test_readme.py runs every other block and checks that these are run here).

Each block runs in a script of its own, after a prelude that defines what the block assumes (``train_set``,
``model``, ``path``, ``urls``...), under the launcher the block's library needs."""
from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import pytest

from _helpers import ROOT, child_env, run_launch, torchrun

sys.path.insert(0, str(ROOT / "tests"))
from test_readme import INTEGRATION_BLOCKS, by_first_line  # noqa: E402

pytestmark = pytest.mark.integration

PRELUDE = '''
import os, sys, torch
sys.path[:0] = [{root!r}, {tests!r}]
from autoloader import make_loader
from test_readme import Images
train_set, epochs = Images(), 2
def done(*what):  # one write per line: two ranks' print()s, unbuffered, interleaved their pieces
    sys.stdout.write(" ".join(["rank done", *map(str, what)]) + "\\n")
'''


def _script(tmp_path: Path, prelude: str, prefix: str, epilogue: str) -> Path:
    block = by_first_line(prefix)[0]
    script = tmp_path / "block.py"
    head = PRELUDE.format(root=str(ROOT), tests=str(ROOT / "tests")) + f"os.chdir({str(tmp_path)!r})\n"
    script.write_text(head + textwrap.dedent(prelude) + block.text + "\n" + textwrap.dedent(epilogue))
    return script


def _run(command, tmp_path: Path) -> str:
    status, output = run_launch(command, env=child_env(AUTOLOADER_CACHE_DIR=str(tmp_path / "cache")))
    assert status == 0, output[-4000:]
    return output


def test_lightning_block(tmp_path):
    pytest.importorskip("lightning")
    assert INTEGRATION_BLOCKS[0].startswith("class Model")
    script = _script(tmp_path, "import lightning as L\ntrain_set = Images(32)\n", INTEGRATION_BLOCKS[0],
                     "done(trainer.global_rank, trainer.current_epoch)\n")
    output = _run([sys.executable, str(script)], tmp_path)
    assert output.count("rank done") == 2 and "rank done 0 3" in output


def test_accelerate_block(tmp_path):
    pytest.importorskip("accelerate")
    script = _script(tmp_path, '''
        from accelerate import Accelerator
        model = torch.nn.Linear(3 * 8 * 8, 10)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    ''', INTEGRATION_BLOCKS[1], "done(accelerator.process_index, type(loader).__name__)\n")
    output = _run(torchrun(script), tmp_path)  # 2 CPU ranks, as tests/integrations/test_accelerate.py runs them
    assert output.count("rank done") == 2 and "PrefetchLoader" in output


def test_hf_datasets_block(tmp_path):
    datasets = pytest.importorskip("datasets")
    path = tmp_path / "arrow"
    datasets.Dataset.from_dict({"pixel_values": [[[i % 255] * 4] * 3 for i in range(256)],
                                "label": [i % 10 for i in range(256)]}).save_to_disk(str(path))
    script = _script(tmp_path, f'''
        import datasets
        path, mean, std = {str(path)!r}, (10.0, 10.0, 10.0), (2.0, 2.0, 2.0)
    ''', INTEGRATION_BLOCKS[2], '''
        batch = next(iter(loader))
        print('batch', sorted(batch), batch['pixel_values'].dtype)
    ''')
    output = _run([sys.executable, str(script)], tmp_path)
    assert "batch ['label', 'pixel_values'] torch.float32" in output


def test_webdataset_block(tmp_path):
    wds = pytest.importorskip("webdataset")
    import io

    from PIL import Image
    urls = []
    for shard in range(4):
        url = str(tmp_path / f"shard-{shard}.tar")
        with wds.TarWriter(url) as sink:
            for i in range(16):
                image = io.BytesIO()
                Image.new("RGB", (8, 8), (i, shard, 0)).save(image, format="JPEG")
                sink.write({"__key__": f"{shard}-{i:03d}", "jpg": image.getvalue(), "cls": str(i % 10).encode()})
        urls.append(url)
    script = _script(tmp_path, f'''
        import webdataset as wds
        urls = {urls!r}
    ''', INTEGRATION_BLOCKS[3], '''
        samples = sum(len(labels) for images, labels in loader)
        print('samples', samples)
    ''')
    output = _run([sys.executable, str(script)], tmp_path)
    assert "samples 64" in output


@pytest.mark.ray
def test_ray_block(tmp_path):
    pytest.importorskip("ray")
    script = _script(tmp_path, "import autoloader.ray\ntrain_step = lambda *batch: None\n", INTEGRATION_BLOCKS[4],
                     "done(loader.tuning.source, type(loader).__name__, loader.stats.batches)\n")
    output = _run([sys.executable, str(script)], tmp_path)  # a local Ray, started and shut down by autoloader
    assert "rank done tuned PrefetchLoader 4" in output and "Chosen: ray tasks=" in output, output[-3000:]

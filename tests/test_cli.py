"""The ``autotune`` command end to end (subprocesses with their own cache directory), and its parts: the report
text, the doctor's checks fed with fakes, the plot, the demo dataset."""
from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from autoloader import cli
from autoloader.cache import CacheEntry, TuneCache
from autoloader.cli.demo import DemoImages, baselines, cores_rule_workers
from autoloader._fingerprint import machine_fingerprint
from autoloader.cli.doctor import (DeviceHolder, ShmNeed, check_cache, check_cpus, check_gpu_holders, check_open_files,
                               check_saved_profile, check_shm, check_start_method, check_thread_env,
                               find_nvidia_holders, shm_needs)
from autoloader.probe import CpuInfo, ShmInfo, probe_machine, save_profile
from autoloader.cli.doctor import format_findings
from autoloader.report import BOTTLENECK_WORDS, format_tune_result
from autoloader.results import LoaderConfig, TrialResult, TuneResult

REPO = Path(__file__).resolve().parents[1]
MIB = 1 << 20
USER_MODULE = "autotune_user_data"
USER_CODE = textwrap.dedent('''
    import time
    import torch
    from torch.utils.data import Dataset

    class Squares(Dataset):
        """Tiny samples with a 0.2 ms cost each, so every trial is short."""
        def __init__(self, n=192):
            self.n = n
        def __len__(self):
            return self.n
        def __getitem__(self, i):
            end = time.perf_counter() + 0.0002
            while time.perf_counter() < end:
                pass
            return torch.full((8,), float(i)), i

    def make_ds():
        return Squares()

    def make_list():
        return [1, 2, 3]

    answer = 42
    ''')


@pytest.fixture
def work(tmp_path, monkeypatch):
    """A directory holding the user's module, used as the cwd; AUTOLOADER_CACHE_DIR is its ``cache`` folder."""
    (tmp_path / f"{USER_MODULE}.py").write_text(USER_CODE)
    monkeypatch.setenv("AUTOLOADER_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [str(tmp_path)] + sys.path)  # the cwd first, as load_dataset makes it
    yield tmp_path
    sys.modules.pop(USER_MODULE, None)


def run_cli(args, cwd, timeout=120):
    env = {**os.environ, "PYTHONPATH": str(REPO), "AUTOLOADER_CACHE_DIR": str(Path(cwd) / "cache")}
    return subprocess.run([sys.executable, "-m", "autoloader.cli", *args], capture_output=True, text=True,
                          env=env, cwd=cwd, timeout=timeout)


def one_line_error(err: str) -> None:
    assert err.count("\n") == 1 and "Traceback" not in err, err


def trial(n, rate, *, prefetch=2, status="ok", reason=None, batch_bytes=MIB, **kw):
    config = LoaderConfig(n, prefetch if n else None, False, False)
    return TrialResult(config=config, status=status, reason=reason, samples_per_s=rate if status == "ok" else None,
                       startup_s=0.1, stall_fraction=0.2 if status == "ok" else None,
                       worker_cpu_util=0.9 if n and status == "ok" else None, batch_bytes=batch_bytes, **kw)


def tuned_result(**kw):
    trials = (trial(0, 500.0), trial(2, 980.0), trial(4, 1000.0),
              trial(8, None, status="skipped", reason="memory: 8 workers x 900 MiB exceed the budget"),
              trial(16, None, status="failed", reason="worker died: killed"))
    base = dict(num_workers=2, prefetch_factor=2, pin_memory=False, persistent_workers=True, samples_per_s=980.0,
                bottleneck="cpu", source="tuned", trials=trials, consumer_samples_per_s=2000.0, seconds=6.5,
                reason="fewest workers within 5% of the best", created=1.7e9)
    base.update(kw)
    return TuneResult(**base)


# ---------------------------------------------------------------- end to end

def test_tune_caches_under_make_loaders_key_then_show_force_and_clear(work, monkeypatch):
    spec = f"{USER_MODULE}:make_ds"
    machine = machine_fingerprint(probe_machine(disk=False, gpus=False))
    args = ["tune", spec, "--batch-size", "8", "--budget", "4", "--step", "0.001", "--json"]
    proc = run_cli(args, work)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)                       # stdout is pure JSON ...
    assert "trial workers=0" in proc.stderr             # ... while progress went to stderr
    assert out["result"]["source"] == "tuned" and out["key"]
    key = out["key"]
    assert (work / "cache" / f"{key}.json").is_file()

    shown = json.loads(run_cli(["show", "--json"], work).stdout)
    [entry] = shown["entries"]
    assert entry["key"] == key and entry["error"] is None
    assert entry["meta"]["dataset"] == "Squares" and entry["meta"]["batch_size"] == 8
    assert entry["result"]["num_workers"] == out["result"]["num_workers"]

    # A training script calling make_loader with the same arguments gets the entry: no trial runs.
    from autoloader import make_loader

    module = __import__(USER_MODULE)
    loader = make_loader(module.make_ds(), 8, step=0.001, budget=4.0)
    if loader.tuning.source != "cache" and machine_fingerprint(probe_machine(disk=False, gpus=False)) != machine:
        pytest.skip("the machine fingerprint changed during the test (free memory crossed a bucket edge)")
    assert loader.tuning.source == "cache"
    assert loader.tuning.to_dict() == {**out["result"], "source": "cache"}

    again = run_cli(args + ["--quiet"], work)
    assert again.returncode == 0 and json.loads(again.stdout)["result"]["source"] == "cache"
    assert json.loads(again.stdout)["key"] == key and "trial" not in again.stderr
    text = run_cli(args[:-1] + ["--quiet"], work)
    assert "from the cache" in text.stdout and "--force" in text.stdout

    forced = run_cli(args + ["--force"], work)
    assert forced.returncode == 0, forced.stderr
    assert json.loads(forced.stdout)["result"]["source"] == "tuned" and json.loads(forced.stdout)["key"] == key

    unknown = run_cli(["clear", "f" * 32], work)
    assert unknown.returncode == 1 and "no cache entry matches" in unknown.stderr
    one_line_error(unknown.stderr)
    cleared = run_cli(["clear", key[:8], "--json"], work)
    assert cleared.returncode == 0 and json.loads(cleared.stdout)["keys"] == [key]
    assert json.loads(run_cli(["show", "--json"], work).stdout)["entries"] == []


def test_bare_autotune_probes_tunes_the_demo_and_compares(work):
    plot = importlib_has("matplotlib")
    args = ["--json", "--budget", "8", "--no-disk"] + (["--plot", "demo.png"] if plot else [])
    proc = run_cli(args, work)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert "trial workers=0" in proc.stderr
    assert Path(out["profile_path"]).is_file() and out["profile"]["disk"] is None
    result = TuneResult.from_dict(out["result"])
    assert result.source == "tuned" and result.samples_per_s > 0 and result.bottleneck in BOTTLENECK_WORDS
    serial, rule = out["baselines"]
    assert serial["config"]["num_workers"] == 0 and serial["measured_by_tuner"] and serial["samples_per_s"] > 0
    assert rule["config"]["num_workers"] == cores_rule_workers(out["profile"]["cpu"]["usable"])
    assert rule["samples_per_s"] is not None or rule["status"] != "ok"
    if plot:
        assert (work / "demo.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def importlib_has(name):
    import importlib.util

    return importlib.util.find_spec(name) is not None


def test_doctor_runs_here(work):
    proc = run_cli(["doctor", "--json"], work)
    findings = json.loads(proc.stdout)["findings"]
    names = {f["name"] for f in findings}
    assert {"shared memory", "open files", "usable CPUs", "start method", "thread variables", "GPUs",
            "GPU device holders", "machine profile", "cache"} <= names
    assert all(f["status"] in ("ok", "warn", "fail", "info") and f["detail"] for f in findings)
    assert proc.returncode == (1 if any(f["status"] == "fail" for f in findings) else 0)
    holders = next(f for f in findings if f["name"] == "GPU device holders")
    if not any(p.startswith("nvidia") for p in os.listdir("/dev")):
        assert holders["status"] == "info" and "no NVIDIA device files" in holders["detail"]
    code = cli.main(["doctor"])
    assert code == proc.returncode


# ---------------------------------------------------------------- failures and usage (in process: no trial runs)

@pytest.mark.parametrize("spec, message", [
    ("no_such_module_xyz:make", "cannot import module 'no_such_module_xyz' (No module named 'no_such_module_xyz')"),
    (f"{USER_MODULE}:nope", f"module '{USER_MODULE}' has no attribute 'nope'"),
    (f"{USER_MODULE}:make_list", f"{USER_MODULE}:make_list returned a list, not a Dataset"),
    (f"{USER_MODULE}:answer", "is an int, not a Dataset or a function returning one"),
    (USER_MODULE, "expected MODULE:FACTORY"),
])
def test_bad_module_factory_fails_with_one_line(work, capsys, spec, message):
    assert cli.main(["tune", spec, "--batch-size", "4", "--json"]) == 1
    out, err = capsys.readouterr()
    assert out == "" and message in err
    one_line_error(err)


def test_bad_spec_in_a_subprocess_has_no_traceback(work):
    proc = run_cli(["tune", f"{USER_MODULE}:make_list", "--batch-size", "4"], work)
    assert proc.returncode == 1 and proc.stdout == ""
    assert proc.stderr.startswith("autotune tune: error:")
    one_line_error(proc.stderr)


@pytest.mark.parametrize("argv", [["tune"], ["tune", "m:f"], ["--budget", "0"], ["--batch-size", "x"],
                                  ["tune", "m:f", "--batch-size", "2", "--max-workers", "-1"],
                                  ["tune", "m:f", "--batch-size", "2", "--device", "gpu!"],
                                  ["clear", "--all", "abc"], ["nonsense"]])
def test_bad_usage_exits_2(work, capsys, argv):
    assert cli.main(argv) == 2
    assert "usage:" in capsys.readouterr().err


def test_plot_without_matplotlib_fails_before_tuning(work, capsys, monkeypatch):
    monkeypatch.setattr("autoloader.cli.plot.available", lambda: False)
    assert cli.main(["tune", f"{USER_MODULE}:make_ds", "--batch-size", "4", "--plot", "x.png"]) == 1
    err = capsys.readouterr().err
    assert "install autoloader[plot] (matplotlib) for --plot" in err
    one_line_error(err)
    assert not (work / "cache").exists()


def test_clear_keeps_the_profile_unless_all(work, capsys):
    cache = TuneCache(work / "cache")
    for key in ("a" * 32, "b" * 32):
        cache.put(key, tuned_result(), meta={"dataset": "Fake", "batch_size": 4})
    save_profile(probe_machine(disk=False, gpus=False))
    assert cli.main(["show"]) == 0
    out = capsys.readouterr().out
    assert "a" * 32 in out and "Fake" in out and "2 usable" in out and "Machine profile (saved)" in out
    assert cli.main(["clear", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["removed"] == 2
    assert cache.entries() == [] and (work / "cache" / "machine.json").is_file()
    assert cli.main(["clear", "--all"]) == 0
    assert "including machine.json" in capsys.readouterr().out
    assert not (work / "cache" / "machine.json").exists()
    assert cli.main(["show", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["profile"] is None


def test_clear_ambiguous_prefix_fails(work, capsys):
    cache = TuneCache(work / "cache")
    cache.put("ab" + "0" * 30, tuned_result())
    cache.put("ab" + "1" * 30, tuned_result())
    assert cli.main(["clear", "ab"]) == 1
    err = capsys.readouterr().err
    assert "2 cache entries match" in err
    one_line_error(err)
    assert len(cache.entries()) == 2


# ---------------------------------------------------------------- report text

def test_format_tune_result_table_marks_the_choice_and_shows_reasons():
    text = format_tune_result(tuned_result())
    assert str(tuned_result()) == text
    lines = text.splitlines()
    assert "num_workers=2, prefetch_factor=2" in lines[0] and "persistent_workers=True" in lines[0]
    assert "980 samples/s" in text and BOTTLENECK_WORDS["cpu"] in text and "tuned in 6.5 s (5 trials)" in text
    assert "2,000 samples/s" in text                                       # the consumer's own rate
    header = next(line for line in lines if "workers" in line and "vs best" in line)
    for column in ("prefetch", "pin", "samples/s", "startup s", "stall %", "worker CPU %", "status"):
        assert column in header
    chosen = [line for line in lines if line.lstrip().startswith("*")]
    assert len(chosen) == 1 and " 2 " in chosen[0] and "98%" in chosen[0]
    assert "skipped: memory: 8 workers" in text and "failed: worker died" in text


def test_format_tune_result_without_trials():
    cached = tuned_result(source="cache", trials=())
    assert "from the cache" in format_tune_result(cached) and "no trials recorded" in format_tune_result(cached)
    fallback = TuneResult(0, None, False, False, None, None, "fallback", reason="could not tune: boom")
    text = format_tune_result(fallback)
    assert "fallback, not tuned: could not tune: boom" in text and "unknown" in text


def test_plot_writes_a_png(tmp_path):
    pytest.importorskip("matplotlib")
    from autoloader.cli.plot import plot_tune_result

    path = plot_tune_result(tuned_result(), tmp_path / "t.png")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 5000


# ---------------------------------------------------------------- doctor checks, with fakes

def entry(result, key="c" * 32, meta=None):
    return CacheEntry(key, Path("/x"), 1.0, meta or {"dataset": "Fake"}, result, None if result else "corrupt")


def test_shm_check_against_cached_needs():
    needs = shm_needs([entry(tuned_result())])              # (2 workers x prefetch 2 + 2) x 1 MiB batches
    assert [n.need_bytes for n in needs] == [6 * MIB] and "Fake" in needs[0].label
    assert shm_needs([entry(tuned_result(num_workers=0, prefetch_factor=None)), entry(None)]) == []
    shm = ShmInfo("/dev/shm", 64 * MIB, 60 * MIB)
    assert check_shm(shm, [ShmNeed("big", 100 * MIB)]).status == "fail"
    warn = check_shm(shm, [ShmNeed("half", 40 * MIB)])
    assert warn.status == "warn" and "--shm-size" in warn.fix
    assert check_shm(shm, [ShmNeed("small", MIB)]).status == "ok"
    assert check_shm(shm, []).status == "warn"                              # Docker's 64 MiB default
    assert check_shm(ShmInfo("/dev/shm", 8 << 30, 8 << 30), []).status == "ok"
    assert check_shm(ShmInfo("/dev/shm", None, None), []).status == "info"


def test_open_files_check():
    low = check_open_files(1024, 1048576, sharing_strategy="file_descriptor", max_cached_workers=16)
    assert low.status == "warn" and "ulimit -n 65536" in low.fix and "set_sharing_strategy('file_system')" in low.fix
    assert "16 workers" in low.detail
    assert "ulimit -n 4096" in check_open_files(1024, 4096, sharing_strategy="file_descriptor").fix
    stuck = check_open_files(1024, 1024, sharing_strategy="file_descriptor", max_cached_workers=1)
    assert "raise the hard limit (1024)" in stuck.fix and "uses 1 workers" not in stuck.detail
    assert check_open_files(1024, 4096, sharing_strategy="file_system").status == "ok"
    assert check_open_files(65536, 65536, sharing_strategy="file_descriptor").status == "ok"
    unlimited = check_open_files(None, None, sharing_strategy="file_descriptor")
    assert unlimited.status == "ok" and "unlimited" in unlimited.detail


def test_cpu_quota_check():
    quota = check_cpus(CpuInfo(usable=4, logical=64, physical=32, model="x", affinity=64, quota=4.0))
    assert quota.status == "warn" and "os.cpu_count() says 64 but this process may use 4" in quota.detail
    assert "cgroup CPU quota 4" in quota.detail
    assert check_cpus(CpuInfo(usable=8, logical=8, physical=4, model="x", affinity=8, quota=None)).status == "ok"
    assert check_cpus(CpuInfo(None, None, None, None, None, None)).status == "info"


def test_start_method_and_thread_checks():
    spawn = check_start_method("spawn")
    assert spawn.status == "info" and '__name__ == "__main__"' in spawn.fix and "pickl" in spawn.detail
    assert check_start_method("fork").status == "ok"
    assert check_thread_env({}, usable_cpus=16).status == "warn"
    assert check_thread_env({}, usable_cpus=2).status == "info"
    assert check_thread_env({"OMP_NUM_THREADS": "1"}, usable_cpus=16).status == "ok"
    assert check_thread_env({"OMP_NUM_THREADS": "64"}, usable_cpus=8).status == "warn"


def test_nvidia_holders_found_from_fd_links(tmp_path):
    fd = tmp_path / str(os.getpid()) / "fd"
    fd.mkdir(parents=True)
    os.symlink("/dev/nvidia0", fd / "7")
    os.symlink("/dev/nvidiactl", fd / "8")
    os.symlink("/tmp/other", fd / "9")
    holders, _ = find_nvidia_holders(proc_root=str(tmp_path))
    [me] = holders
    assert me.pid == os.getpid() and me.devices == ("/dev/nvidia0", "/dev/nvidiactl")
    assert find_nvidia_holders(proc_root=str(tmp_path), exclude={os.getpid()})[0] == []
    files = ["/dev/nvidia0", "/dev/nvidiactl"]
    assert check_gpu_holders(holders, device_files=files).status == "info"
    orphan = check_gpu_holders([DeviceHolder(4242, "python", 1, ("/dev/nvidia0",))], device_files=files)
    assert orphan.status == "warn" and "orphaned" in orphan.detail and "kill 4242" in orphan.fix
    assert check_gpu_holders([], device_files=files).status == "ok"
    none = check_gpu_holders([], device_files=[])
    assert none.status == "info" and "no NVIDIA device files" in none.detail


def test_profile_and_cache_checks():
    current = probe_machine(disk=False, gpus=False)
    assert check_saved_profile(None, current).status == "info"
    assert check_saved_profile(current, current).status == "ok"
    from dataclasses import replace

    old = check_saved_profile(replace(current, torch_version="1.0"), current)
    assert old.status == "warn" and "torch 1.0 ->" in old.detail
    bad = check_cache([entry(None), entry(tuned_result(), key="d" * 32)])
    assert bad.status == "warn" and "1 of 2" in bad.detail and "autotune clear" in bad.fix
    text = format_findings([bad, old])
    assert "[warn] cache:" in text and "fix: `autotune clear" in text


# ---------------------------------------------------------------- the demo dataset

def test_demo_dataset_is_deterministic_picklable_and_image_like():
    data = DemoImages(length=20)
    image, label = data[3]
    again, _ = pickle.loads(pickle.dumps(data))[3]
    assert image.shape == (3, 64, 64) and image.dtype == torch.float32 and label == 3
    assert torch.equal(image, again) and not torch.equal(image, data[4][0])
    assert len(data) == 20 and data[-1][1] == 19 % 10
    with pytest.raises(IndexError):
        data[20]
    with pytest.raises(ValueError, match="size"):
        DemoImages(size=4)
    assert [cores_rule_workers(n) for n in (None, 1, 2, 8)] == [1, 1, 1, 7]


# The copy-on-read check can fire here: a worker forked from the big pytest process dirties some of its heap.
@pytest.mark.filterwarnings("ignore:each DataLoader worker's private memory grew")
def test_baselines_reuse_the_tuners_trials_and_time_the_rest():
    data = DemoImages(length=64, work=0)
    serial = trial(0, 500.0)
    result = tuned_result(trials=(serial,), num_workers=0, prefetch_factor=None, persistent_workers=False)
    no_workers, rule = baselines(data, 8, result, usable_cpus=3, step=None, device=torch.device("cpu"),
                                 time_limit=3.0)
    assert no_workers.trial is serial and no_workers.measured_by_tuner and no_workers.samples_per_s == 500.0
    assert rule.config == LoaderConfig(2, 2, False, False) and not rule.measured_by_tuner
    assert rule.trial is not None and rule.trial.config == rule.config and rule.trial.status in ("ok", "failed")
    capped = baselines(data, 8, result, usable_cpus=3, step=None, device=torch.device("cpu"), max_workers=0)[1]
    assert capped.trial is None and capped.samples_per_s is None
    from autoloader.cli.demo import format_comparison

    text = format_comparison(result, [no_workers, capped])
    assert "max(1, 3 usable CPUs - 1) = 2 workers" in text and "not run" in text and "tuned is 1.96x" in text


def test_bare_autotune_refuses_bad_places_before_probing(work, capsys):
    assert cli.main(["--data-dir", str(work / "absent"), "--no-disk"]) == 2
    assert capsys.readouterr().err.startswith("autotune: error: --data-dir")
    if not torch.cuda.is_available():
        assert cli.main(["--device", "cuda", "--no-disk"]) == 1
        err = capsys.readouterr().err
        assert err.startswith("autotune: error: --device cuda: no CUDA device")
        one_line_error(err)
    assert not (work / "cache" / "machine.json").exists()

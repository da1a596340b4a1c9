"""The ``autotune`` command end to end: subprocesses with their own cache directory (tune, show, clear, probe, the
bare command) and in-process runs of ``cli.main`` for failures and usage errors."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

import autoloader.cli.main as cli
from autoloader.cache import TuneCache
from autoloader.cli.main import main
from autoloader.cli.demo import cores_rule_workers
from autoloader.cache.fingerprint import machine_fingerprint
from autoloader.probe import MachineProfile, load_profile, probe_machine, save_profile
from autoloader.results import BOTTLENECKS, TuneResult
from helpers import USER_MODULE, one_line_error, probe_files, run_cli, tuned_result


# ---------------------------------------------------------------- end to end


@pytest.mark.slow
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
    assert entry["result"]["config"] == out["result"]["config"] and "num_workers" in entry["result"]["config"]

    # A training script calling make_loader with the same arguments gets the entry: no trial runs.
    from autoloader import make_loader

    module = __import__(USER_MODULE)
    loader = make_loader(module.make_ds(), 8, step=0.001, budget=4.0)
    next(iter(loader))  # the cache is looked up at the first iter()
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
    assert result.source == "tuned" and result.samples_per_s > 0 and result.bottleneck in BOTTLENECKS
    serial, rule = out["baselines"]
    assert serial["config"]["num_workers"] == 0 and serial["measured_by_tuner"] and serial["samples_per_s"] > 0
    assert rule["config"]["num_workers"] == cores_rule_workers(out["profile"]["cpu"]["usable"])
    assert rule["samples_per_s"] is not None or rule["status"] != "ok"
    if plot:
        assert (work / "demo.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def importlib_has(name):
    import importlib.util

    return importlib.util.find_spec(name) is not None


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
                                  ["clear", "--all", "abc"], ["nonsense"],
                                  ["tune", "m:f", "--batch-size", "2", "--memory-budget", "1.5"],
                                  ["tune", "m:f", "--batch-size", "2", "--memory-budget", "lots"],
                                  ["--memory-budget", "0"]])
def test_bad_usage_exits_2(work, capsys, argv):
    assert cli.main(argv) == 2
    assert "usage:" in capsys.readouterr().err


def test_plot_without_matplotlib_fails_before_tuning(work, capsys, monkeypatch):
    monkeypatch.setattr("autoloader.cli.plot.available", lambda: False)
    assert cli.main(["tune", f"{USER_MODULE}:make_ds", "--batch-size", "4", "--plot", "x.png"]) == 1
    err = capsys.readouterr().err
    assert "--plot needs matplotlib: pip install matplotlib" in err
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


def test_bare_autotune_refuses_bad_places_before_probing(work, capsys):
    assert cli.main(["--data-dir", str(work / "absent"), "--no-disk"]) == 2
    assert capsys.readouterr().err.startswith("autotune: error: --data-dir")
    if not torch.cuda.is_available():
        assert cli.main(["--device", "cuda", "--no-disk"]) == 1
        err = capsys.readouterr().err
        assert err.startswith("autotune: error: --device cuda: no CUDA device")
        one_line_error(err)
    assert not (work / "cache" / "machine.json").exists()


# ---------------------------------------------------------------- autotune probe


def test_cli_probe_json(tmp_path):
    proc = run_cli(["probe", "--json"], tmp_path)
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert set(data) == {"cpu", "memory", "shm", "disk", "gpus", "start_method", "torch_version",
                         "python_version", "thread_env", "created", "schema"}
    assert set(data["cpu"]) == {"usable", "logical", "physical", "model", "affinity", "quota"}
    assert set(data["memory"]) == {"total_bytes", "available_bytes", "limit_bytes", "budget_bytes", "headroom_bytes"}
    assert set(data["shm"]) == {"path", "total_bytes", "free_bytes"}
    assert set(data["disk"]) == {"path", "seq_read_mb_s", "rand_read_iops", "cached_seq_read_mb_s", "bypass"}
    assert data["disk"]["path"] == str(tmp_path / "cache")
    saved = tmp_path / "cache" / "machine.json"
    assert MachineProfile.from_dict(json.loads(saved.read_text())) == MachineProfile.from_dict(data)
    assert probe_files(tmp_path / "cache") == []


def test_cli_probe_under_taskset_sees_one_cpu(tmp_path):
    if shutil.which("taskset") is None:
        pytest.skip("taskset not installed")
    proc = run_cli(["probe", "--json", "--no-disk"], tmp_path, prefix=("taskset", "-c", "0"))
    assert proc.returncode == 0, proc.stderr
    cpu = json.loads(proc.stdout)["cpu"]
    assert (cpu["usable"], cpu["affinity"]) == (1, 1)


def test_cli_probe_table_and_usage_errors(tmp_path, cache_dir, capsys):
    assert main(["probe", "--no-disk"]) == 0
    out, err = capsys.readouterr()
    assert out.startswith("Machine profile") and "not probed" in out
    assert str(cache_dir / "machine.json") in err
    assert load_profile() is not None
    assert main(["probe", "--bogus"]) == 2
    assert main(["probe", "--data-dir", str(tmp_path / "absent")]) == 2
    assert "--data-dir" in capsys.readouterr().err
    assert main(["--help"]) == 0
    assert "probe" in capsys.readouterr().out


def test_cli_probe_fails_with_one_line_when_the_profile_cannot_be_saved(tmp_path, monkeypatch, capsys):
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("x")
    monkeypatch.setenv("AUTOLOADER_CACHE_DIR", str(blocker / "cache"))
    assert main(["probe", "--no-disk", "--json"]) == 1
    out, err = capsys.readouterr()
    json.loads(out)
    assert err.count("\n") == 1 and "cannot save" in err


@pytest.mark.parametrize("text, value", [("0.5", 0.5), ("1", 1.0), (".25", 0.25), ("8GiB", 8 * 2**30),
                                         ("512M", 512 * 2**20), ("1.5g", int(1.5 * 2**30)), ("4096", 4096), ("2", 2)])
def test_memory_budget_option_takes_a_fraction_or_bytes(text, value):
    got = cli.memory_budget_arg(text)
    assert got == value and type(got) is type(value)
    assert cli.build_parser().parse_args(["tune", "m:f", "--batch-size", "2", "--memory-budget", text]).memory_budget \
        == value

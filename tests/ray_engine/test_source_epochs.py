"""``RaySource`` (autoloader/ray/source.py) without Ray: each epoch hands Ray exactly the index batches a plain
DataLoader draws (NOTE [ Exact batches through Ray ]), as consecutive runs, the first drawn before the first batch and
each next one drawn a few batches at a time and started before the current run drains, never more than two at once;
a batch that raised comes out as a ``BatchError`` and the epoch goes on; the sampler is asked past its end only after
the last batch; leaving early closes every run; an empty epoch never starts Ray; the payload is put once per Ray
session, an unpicklable one being a TypeError naming the fix. Ray's side (``open_session``, ``Feed``) is a stand-in;
the real run is in tests/integrations (test_ray.py, test_ray_engine.py)."""
import threading

import pytest
import torch
from torch.utils.data import DataLoader, Dataset

from autoloader.loader.source import BatchError
from autoloader.ray import plan
from autoloader.ray import source as source_module
from autoloader.ray.records import RayConfig, RayTuning
from autoloader.ray.source import Payload, RaySource
from autoloader.ray.transport import Failure
from autoloader.ray.waits import BATCH, STARTUP
from autoloader.ray.work import fetch


class Squares(Dataset):
    def __init__(self, n=10, bad=None):
        self.n, self.bad = n, bad

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        if i == self.bad:
            raise KeyError(f"sample {i}")
        return torch.tensor([i * i]), i


def _tuning(tasks=2, block=1, prefetch=1):
    return RayTuning(RayConfig(tasks, batches_per_task=block, prefetch=prefetch), 100.0, "tuned",
                     {"nodes": 1, "cpus": 4.0, "gpus": 0.0, "node_cpus": [4.0], "resources": []})


class StandInFeed:
    """``Feed``'s interface over its chunk, loaded here by ``work.fetch`` (a batch that raises as its ``Failure``);
    ``blocks_left`` falls as the loop takes batches."""

    made = []
    live = 0
    most_live = 0

    def __init__(self, ray, ref, chunk, config, *, first, wait, pin=False):
        self.chunk, self.config, self.first, self.wait, self.pin = chunk, config, first, wait, pin
        self.dataset, self.collate = ref
        self.reader = chunk.batches()
        self.next_k, self.closed = 0, False
        StandInFeed.made.append(self)
        StandInFeed.live += 1
        StandInFeed.most_live = max(StandInFeed.most_live, StandInFeed.live)

    @property
    def blocks_left(self):
        return -(-(self.chunk.count - self.next_k) // self.config.batches_per_task)

    def next(self):
        if self.next_k == self.chunk.count:
            raise StopIteration
        position = self.chunk.start + self.next_k
        self.next_k += 1
        try:
            return position, fetch(self.dataset, self.collate, self.reader.read(position), self.chunk.batched)
        except Exception as err:
            return position, Failure.of(err)

    def close(self):
        if not self.closed:
            StandInFeed.live -= 1
        self.closed = True

    @property
    def batches(self):
        return [self.reader.read(self.chunk.start + j) for j in range(self.chunk.count)]


class StandInRay:
    def __init__(self):
        self.puts = []

    def put(self, value):
        self.puts.append(value)
        return value  # the "reference" is the value itself: StandInFeed loads from it


@pytest.fixture
def ray_side(monkeypatch):
    """``open_session``, ``import_ray`` and ``Feed`` as stand-ins; records the sessions opened."""
    ray, opened = StandInRay(), []
    session = object()
    StandInFeed.made, StandInFeed.live, StandInFeed.most_live = [], 0, 0
    monkeypatch.setattr(source_module, "Feed", StandInFeed)
    monkeypatch.setattr(source_module, "import_ray", lambda: ray)
    monkeypatch.setattr(source_module, "open_session", lambda address, *, num_cpus, runtime_env: opened.append(
        (address, num_cpus, runtime_env)) or session)
    return ray, opened


def _ids(batches):
    return [batch[1].tolist() if isinstance(batch[1], torch.Tensor) else batch[1] for batch in batches]


@pytest.mark.parametrize("batch_size", [3, None])
def test_every_epoch_is_the_plain_dataloaders_drawn_at_its_start(ray_side, batch_size):
    ray, opened = ray_side
    dataset = Squares()

    def plain():
        return DataLoader(dataset, batch_size=batch_size, shuffle=True, generator=torch.Generator().manual_seed(3))

    source = RaySource(plain(), _tuning(block=4), address="h:1", num_cpus=3, pin=True,
                       runtime_env={"working_dir": "."}, startup=STARTUP.with_seconds(9.0),
                       wait=BATCH.with_seconds(7.0))
    reference = plain()
    for _ in range(2):
        torch.manual_seed(0)
        got = _ids(source.epoch())
        torch.manual_seed(0)
        assert got == _ids(reference)
    feed = StandInFeed.made[0]
    assert feed.chunk.count == len(reference) and feed.closed
    assert (feed.config, feed.chunk.batched, feed.first.seconds, feed.wait.seconds, feed.pin) == \
        (RayConfig(2, batches_per_task=4), batch_size is not None, 9.0, 7.0, True)
    assert opened == [("h:1", 3, {"working_dir": "."})] * 2 and len(ray.puts) == 1, "the payload is put once"


def test_a_long_epoch_goes_as_consecutive_runs_drawn_while_the_loop_trains(ray_side, monkeypatch):
    monkeypatch.setattr(plan, "FIRST_RUN_BLOCKS", 2)
    monkeypatch.setattr(plan, "MAX_RUN_BLOCKS", 6)
    monkeypatch.setattr(plan, "DRAW_BITE", 1)
    template = DataLoader(Squares(100), batch_size=2, shuffle=True, generator=torch.Generator().manual_seed(2))
    source = RaySource(template, _tuning(tasks=1, block=2, prefetch=1), address=None, num_cpus=None, pin=False)
    torch.manual_seed(5)
    got = _ids(source.epoch())
    torch.manual_seed(5)
    assert got == _ids(DataLoader(Squares(100), batch_size=2, shuffle=True,
                                  generator=torch.Generator().manual_seed(2)))
    runs = StandInFeed.made
    counts = [feed.chunk.count for feed in runs]
    assert counts[:3] == [8, 12, 12] and sum(counts) == 50, "first run of 4 blocks (two waves), then the cap"
    assert [feed.chunk.start for feed in runs] == [sum(counts[:k]) for k in range(len(runs))]
    assert StandInFeed.most_live == 2, "the next run starts before the current one drains, never a third"
    assert runs[0].first.name == "STARTUP" and {feed.first.name for feed in runs[1:]} == {"BATCH"}


def test_a_batch_that_raised_is_a_batch_error_and_the_epoch_goes_on(ray_side):
    source = RaySource(DataLoader(Squares(6, bad=3), batch_size=1), _tuning(), address=None, num_cpus=None,
                       pin=False)
    items = list(source.epoch())
    assert [item[1] if not isinstance(item, BatchError) else "error" for item in items] == \
        [torch.tensor([0]), torch.tensor([1]), torch.tensor([2]), "error", torch.tensor([4]), torch.tensor([5])]
    error = items[3].exception
    assert isinstance(error, KeyError) and "raised loading batch 3 of the epoch in a Ray worker" in error.__notes__[0]


def test_the_sampler_is_asked_past_its_end_only_after_the_last_batch(ray_side):
    source = RaySource(DataLoader(Squares(6), batch_size=2, shuffle=True), _tuning(), address=None, num_cpus=None,
                       pin=False)
    it = source.epoch()
    for _ in range(3):
        next(it)
    assert source.epoch_source.drawn == 3
    with pytest.raises(StopIteration):
        next(it)
    assert source.epoch_source.drawn == 4 and source.epoch_source.done


def test_leaving_early_closes_every_run_and_gives_back_what_was_being_drawn(ray_side, monkeypatch):
    monkeypatch.setattr(plan, "FIRST_RUN_BLOCKS", 2)
    source = RaySource(DataLoader(Squares(40), batch_size=2), _tuning(tasks=1, block=1), address=None, num_cpus=None,
                       pin=False)
    it = source.epoch()
    assert [next(it)[1].tolist() for _ in range(2)] == [[0, 1], [2, 3]]
    it.close()
    assert all(feed.closed for feed in StandInFeed.made) and StandInFeed.live == 0
    assert StandInFeed.made[0].batches == [[0, 1], [2, 3], [4, 5], [6, 7]]


def test_a_resumed_epoch_sends_ray_only_the_batches_left(ray_side):
    template = DataLoader(Squares(12), batch_size=2)
    source = RaySource(template, _tuning(), address=None, num_cpus=None, pin=False)
    epoch = source.slicer.epoch()
    epoch.skip(4)
    assert _ids(source.resume(epoch)) == [[8, 9], [10, 11]]
    assert StandInFeed.made[-1].batches == [[8, 9], [10, 11]] and epoch.done


def test_an_empty_epoch_starts_no_ray(ray_side):
    ray, opened = ray_side
    source = RaySource(DataLoader(Squares(0), batch_size=2), _tuning(), address=None, num_cpus=None, pin=False)
    assert list(source.epoch()) == [] and opened == [] and StandInFeed.made == []
    assert source.epoch_source.done


def test_the_next_epochs_use_the_tuning_and_limits_in_force(ray_side):
    source = RaySource(DataLoader(Squares(4), batch_size=2), _tuning(2), address=None, num_cpus=None, pin=False)
    source.use(_tuning(5), startup=STARTUP.with_seconds(11.0), wait=BATCH.with_seconds(9.0))
    assert source.tuning == _tuning(5) and source.config == RayConfig(5)
    list(source.epoch())
    feed = StandInFeed.made[-1]
    assert (feed.config, feed.first.seconds, feed.wait.seconds) == (RayConfig(5), 11.0, 9.0)


def test_the_payload_is_put_once_per_ray_session():
    ray, first, second = StandInRay(), object(), object()
    payload = Payload("dataset", "collate")
    assert payload.ref(ray, first) == ("dataset", "collate") and payload.ref(ray, first) is ray.puts[0]
    assert len(ray.puts) == 1
    payload.ref(ray, second)  # a new session: the refs of the old one died with it
    assert len(ray.puts) == 2


class Unpicklable(StandInRay):
    def __init__(self, error):
        super().__init__()
        self.error = error

    def put(self, value):
        raise self.error


@pytest.mark.parametrize("error", [TypeError("cannot pickle '_thread.lock' object"),
                                   AttributeError("Can't pickle local object 'f.<locals>.g'"),
                                   ValueError("Could not serialize the put value")])
def test_an_unpicklable_dataset_is_a_type_error_naming_the_fix(error):
    with pytest.raises(TypeError, match=r"engine='ray' sends the dataset and collate_fn to Ray's workers, but they "
                                        r"cannot be pickled .* define them at module level") as info:
        Payload(threading.Lock(), None).ref(Unpicklable(error), object())
    assert info.value.__cause__ is error


def test_another_error_from_put_is_raised_as_it_is():
    error = ValueError("object store full")
    with pytest.raises(ValueError) as info:
        Payload("d", None).ref(Unpicklable(error), object())
    assert info.value is error


class Slow(StandInRay):
    def put(self, value):
        threading.Event().wait(5)
        return value


def test_putting_the_payload_waits_within_put(monkeypatch):
    monkeypatch.setattr(source_module, "PUT", source_module.PUT.with_seconds(0.2))
    with pytest.raises(TimeoutError, match=r"ray.put of the dataset .* within 0.2 s \(the dataset and collate_fn\) "
                                           r"\(autoloader.ray.waits.PUT\)"):
        Payload("d", None).ref(Slow(), object())

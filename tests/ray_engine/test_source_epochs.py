"""``RaySource`` (autoloader/ray/source.py) without Ray: each epoch hands Ray exactly the index batches a plain
DataLoader draws (NOTE [ Exact batches through Ray ]), the served count goes back to the epoch when the loop leaves
early, an empty epoch never starts Ray, and the payload is put once per Ray session, an unpicklable one being a
TypeError naming the fix. Ray's side (``open_session``, ``Feed``) is a stand-in; the real run is in
tests/integrations (test_ray.py, test_ray_engine.py)."""
import threading

import pytest
import torch
from torch.utils.data import DataLoader, Dataset

from autoloader.ray import source as source_module
from autoloader.ray.records import RayConfig, RayTuning
from autoloader.ray.source import Payload, RaySource
from autoloader.ray.work import fetch


class Squares(Dataset):
    def __init__(self, n=10):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return torch.tensor([i * i]), i


def _tuning(tasks=2):
    return RayTuning(RayConfig(tasks), 100.0, "tuned", {"nodes": 1, "cpus": 4.0, "gpus": 0.0, "node_cpus": [4.0],
                                                        "resources": []})


class StandInFeed:
    """``Feed``'s interface over the batches it is given, loaded here by ``work.fetch``."""

    made = []

    def __init__(self, ray, ref, batches, config, *, batched, wait_s, pin=False):
        self.args = dict(ray=ray, ref=ref, batches=list(batches), config=config, batched=batched, wait_s=wait_s,
                         pin=pin)
        self.dataset, self.collate = ref
        self.next_k, self.closed = 0, False
        StandInFeed.made.append(self)

    def next(self):
        if self.next_k == len(self.args["batches"]):
            raise StopIteration
        k, self.next_k = self.next_k, self.next_k + 1
        return k, fetch(self.dataset, self.collate, self.args["batches"][k], self.args["batched"])

    def close(self):
        self.closed = True


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
    StandInFeed.made = []
    monkeypatch.setattr(source_module, "Feed", StandInFeed)
    monkeypatch.setattr(source_module, "import_ray", lambda: ray)
    monkeypatch.setattr(source_module, "open_session",
                        lambda address, *, num_cpus: opened.append((address, num_cpus)) or session)
    return ray, opened


def _ids(batches):
    return [batch[1].tolist() if isinstance(batch[1], torch.Tensor) else batch[1] for batch in batches]


@pytest.mark.parametrize("batch_size", [3, None])
def test_every_epoch_is_the_plain_dataloaders_drawn_at_its_start(ray_side, batch_size):
    ray, opened = ray_side
    dataset = Squares()

    def plain():
        return DataLoader(dataset, batch_size=batch_size, shuffle=True, generator=torch.Generator().manual_seed(3))

    source = RaySource(plain(), _tuning(), address="h:1", num_cpus=3, wait_s=7.0, pin=True)
    reference = plain()
    for _ in range(2):
        torch.manual_seed(0)
        got = _ids(source.epoch())
        torch.manual_seed(0)
        assert got == _ids(reference)
    feed = StandInFeed.made[0]
    assert len(feed.args["batches"]) == len(reference) and feed.closed
    assert (feed.args["config"], feed.args["batched"], feed.args["wait_s"], feed.args["pin"]) == \
        (RayConfig(2), batch_size is not None, 7.0, True)
    assert opened == [("h:1", 3)] * 2 and len(ray.puts) == 1, "the payload is put once per session"


def test_leaving_early_tells_the_epoch_how_many_batches_the_loop_got(ray_side):
    source = RaySource(DataLoader(Squares(12), batch_size=2), _tuning(), address=None, num_cpus=None, wait_s=1.0,
                       pin=False)
    it = source.epoch()
    assert [next(it)[1].tolist() for _ in range(2)] == [[0, 1], [2, 3]]
    it.close()
    assert source.epoch_source.position == 2 and StandInFeed.made[-1].closed
    assert StandInFeed.made[-1].args["batches"] == [[0, 1], [2, 3], [4, 5], [6, 7], [8, 9], [10, 11]]


def test_a_resumed_epoch_sends_ray_only_the_batches_left(ray_side):
    template = DataLoader(Squares(12), batch_size=2)
    source = RaySource(template, _tuning(), address=None, num_cpus=None, wait_s=1.0, pin=False)
    epoch = source.slicer.epoch()
    epoch.skip(4)
    assert _ids(source.resume(epoch)) == [[8, 9], [10, 11]]
    assert StandInFeed.made[-1].args["batches"] == [[8, 9], [10, 11]] and epoch.position == 6


def test_an_empty_epoch_starts_no_ray(ray_side):
    ray, opened = ray_side
    source = RaySource(DataLoader(Squares(0), batch_size=2), _tuning(), address=None, num_cpus=None, wait_s=1.0,
                       pin=False)
    assert list(source.epoch()) == [] and opened == [] and StandInFeed.made == []


def test_the_next_epochs_use_the_tuning_and_wait_in_force(ray_side):
    source = RaySource(DataLoader(Squares(4), batch_size=2), _tuning(2), address=None, num_cpus=None, wait_s=1.0,
                       pin=False)
    source.use(_tuning(5), wait_s=9.0)
    assert source.tuning == _tuning(5) and source.config == RayConfig(5)
    list(source.epoch())
    assert (StandInFeed.made[-1].args["config"], StandInFeed.made[-1].args["wait_s"]) == (RayConfig(5), 9.0)


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

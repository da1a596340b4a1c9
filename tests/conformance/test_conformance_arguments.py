"""Every DataLoader argument and combination is accepted or refused as ``DataLoader(...)`` does,
with the same exception type, at construction, and where DataLoader raises, make_loader's message starts with
DataLoader's own words (PyTorch's own ``assertRaisesRegex`` checks pass) and then names the fix. Each case builds both
in the same test. The few where make_loader knowingly differs are listed apart, with why (README "Use it")."""
from __future__ import annotations

import multiprocessing
import re
import unittest

import pytest
import torch
from torch.utils.data import BatchSampler, DataLoader, IterableDataset, SequentialSampler, TensorDataset
from torch.utils.data.datapipes.iter import IterableWrapper

from autoloader import make_loader

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")

DATA = TensorDataset(torch.arange(20.0))
SAMPLER = SequentialSampler(DATA)
BATCHES = BatchSampler(SAMPLER, 4, False)


class Stream(IterableDataset):
    def __iter__(self):
        return iter(range(5))


SAME = [  # (name, dataset, DataLoader keywords)
    ("defaults", DATA, {}),
    ("batch_size=None", DATA, dict(batch_size=None)),
    ("batch_size=0", DATA, dict(batch_size=0)),
    ("batch_size=-1", DATA, dict(batch_size=-1)),
    ("batch_size=8.0", DATA, dict(batch_size=8.0)),
    ("batch_size=True", DATA, dict(batch_size=True)),
    ("batch_size='8'", DATA, dict(batch_size="8")),
    ("batch_size=None drop_last", DATA, dict(batch_size=None, drop_last=True)),
    ("shuffle=3", DATA, dict(shuffle=3)),
    ("shuffle=None", DATA, dict(shuffle=None)),
    ("shuffle='yes'", DATA, dict(shuffle="yes")),
    ("sampler with shuffle", DATA, dict(sampler=SAMPLER, shuffle=True)),
    ("sampler with shuffle=0", DATA, dict(sampler=SAMPLER, shuffle=0)),
    ("batch_sampler with batch_size", DATA, dict(batch_sampler=BATCHES, batch_size=4)),
    ("batch_sampler with batch_size=None", DATA, dict(batch_sampler=BATCHES, batch_size=None)),
    ("batch_sampler with shuffle", DATA, dict(batch_sampler=BATCHES, shuffle=True)),
    ("batch_sampler with sampler", DATA, dict(batch_sampler=BATCHES, sampler=SAMPLER)),
    ("batch_sampler with drop_last", DATA, dict(batch_sampler=BATCHES, drop_last=True)),
    ("IterableDataset with shuffle", Stream(), dict(shuffle=True)),
    ("IterableDataset with shuffle=0", Stream(), dict(shuffle=0)),
    ("IterableDataset with sampler", Stream(), dict(sampler=SAMPLER)),
    ("IterableDataset with batch_sampler", Stream(), dict(batch_sampler=BATCHES)),
    ("IterDataPipe with shuffle", IterableWrapper(range(8)), dict(shuffle=True)),
    ("IterDataPipe with sampler", IterableWrapper(range(8)), dict(sampler=SAMPLER)),
    ("timeout=-1", DATA, dict(timeout=-1)),
    ("timeout=-1 with workers", DATA, dict(timeout=-1, num_workers=2)),
    ("timeout='5'", DATA, dict(timeout="5")),
    ("timeout without workers", DATA, dict(timeout=5, num_workers=0)),
    ("num_workers=-1", DATA, dict(num_workers=-1)),
    ("num_workers='2'", DATA, dict(num_workers="2")),
    ("prefetch_factor with num_workers=0", DATA, dict(prefetch_factor=2, num_workers=0)),
    ("prefetch_factor=-1", DATA, dict(prefetch_factor=-1, num_workers=2)),
    ("persistent_workers with num_workers=0", DATA, dict(persistent_workers=True, num_workers=0)),
    ("persistent_workers='y'", DATA, dict(persistent_workers="y", num_workers=2)),
    ("pin_memory='y'", DATA, dict(pin_memory="y")),
    ("drop_last='y'", DATA, dict(drop_last="y")),
    ("drop_last=1", DATA, dict(drop_last=1)),
    ("multiprocessing_context with num_workers=0", DATA, dict(multiprocessing_context="spawn", num_workers=0)),
    ("multiprocessing_context='bogus'", DATA, dict(multiprocessing_context="bogus", num_workers=2)),
    ("multiprocessing_context=3", DATA, dict(multiprocessing_context=3, num_workers=2)),
    ("multiprocessing_context object", DATA, dict(multiprocessing_context=multiprocessing.get_context("fork"),
                                                  num_workers=2)),
    ("generator, collate_fn, worker_init_fn, in_order", DATA, dict(generator=torch.Generator(), collate_fn=list,
                                                                     worker_init_fn=print, in_order=False)),
    ("an unknown keyword", DATA, dict(bogus=1)),
    ("a list as dataset", [1, 2, 3], {}),
    ("an empty dataset", TensorDataset(torch.zeros(0)), {}),
    ("an empty dataset shuffled", TensorDataset(torch.zeros(0)), dict(shuffle=True)),
]

DIFFERENT = [  # (name, dataset, keywords, DataLoader's outcome, make_loader's, why)
    ("prefetch_factor without num_workers", DATA, dict(prefetch_factor=4), ValueError, None,
     "num_workers is tuned: a knob that needs workers is used when the tuner picks some"),
    ("persistent_workers without num_workers", DATA, dict(persistent_workers=True), ValueError, None,
     "num_workers is tuned: a knob that needs workers is used when the tuner picks some"),
    ("prefetch_factor=0", DATA, dict(prefetch_factor=0, num_workers=2), None, ValueError,
     "DataLoader accepts it and fails with an AssertionError at iter(): refused at once"),
    ("num_workers=2.0", DATA, dict(num_workers=2.0), None, TypeError,
     "DataLoader accepts it and fails with a TypeError at iter(): refused at once, with that type"),
    ("a dataset that is none", 5, {}, None, TypeError,
     "DataLoader accepts it and fails with a TypeError at iter(): refused at once, with that type"),
]


def outcome(build):
    try:
        build()
    except Exception as error:  # noqa: B036 - the type is the outcome
        return type(error)
    return None


@pytest.mark.parametrize("dataset, kwargs", [case[1:] for case in SAME], ids=[case[0] for case in SAME])
def test_argument_is_accepted_or_refused_as_dataloader_does(dataset, kwargs):
    theirs = outcome(lambda: DataLoader(dataset, **kwargs))
    ours = outcome(lambda: make_loader(dataset, cache=False, **kwargs))
    assert ours is theirs, f"DataLoader: {theirs}, make_loader: {ours}"


@pytest.mark.parametrize("dataset, kwargs, theirs, ours, why", [case[1:] for case in DIFFERENT],
                         ids=[case[0] for case in DIFFERENT])
def test_the_known_differences(dataset, kwargs, theirs, ours, why):
    assert outcome(lambda: DataLoader(dataset, **kwargs)) is theirs
    assert outcome(lambda: make_loader(dataset, cache=False, **kwargs)) is ours, why


class Counting(IterableDataset):
    def __iter__(self):
        return iter(range(20))


STREAM = Counting()
VALID_START = multiprocessing.get_all_start_methods()[-1]
DATALOADER_MESSAGES = [  # (regex from PyTorch's test/test_dataloader.py test_invalid_ctor_args_combinations, dataset,
    # keywords); the last five are BatchSampler's and the worker keywords' texts, which that test does not cover
    (ValueError, "num_workers option should be non-negative", DATA, dict(num_workers=-1)),
    (ValueError, "timeout option should be non-negative", DATA, dict(timeout=-1)),
    (ValueError, "batch_size=None option disables auto-batching and is mutually exclusive", DATA,
     dict(batch_size=None, drop_last=True)),
    (ValueError, r"multi-process loading \(num_workers > 0\), but got", DATA,
     dict(num_workers=0, multiprocessing_context=VALID_START)),
    (ValueError, "should specify a valid start method in", DATA, dict(num_workers=1, multiprocessing_context="bad")),
    (TypeError, "multiprocessing_context option should be a valid context ", DATA,
     dict(num_workers=1, multiprocessing_context=object())),
    (ValueError, "sampler option is mutually exclusive with shuffle", DATA, dict(batch_size=11, sampler=SAMPLER,
                                                                                 shuffle=True)),
    (ValueError, "sampler option is mutually exclusive with shuffle", DATA, dict(batch_sampler=BATCHES,
                                                                                 sampler=SAMPLER, shuffle=True)),
    (ValueError, "sampler option is mutually exclusive with shuffle", DATA, dict(batch_sampler=BATCHES,
                                                                                 sampler=SAMPLER, shuffle=3)),
    (ValueError, "batch_sampler option is mutually exclusive with", DATA, dict(batch_size=11, batch_sampler=BATCHES)),
    (ValueError, "batch_sampler option is mutually exclusive with", DATA, dict(shuffle=True, batch_sampler=BATCHES)),
    (ValueError, "batch_sampler option is mutually exclusive with", DATA, dict(drop_last=True, batch_sampler=BATCHES)),
    (ValueError, "batch_sampler option is mutually exclusive with", DATA, dict(drop_last=3, batch_sampler=BATCHES)),
    (ValueError, "DataLoader with IterableDataset: expected unspecified shuffle", STREAM, dict(shuffle=True)),
    (ValueError, "DataLoader with IterableDataset: expected unspecified shuffle", STREAM, dict(shuffle=3)),
    (ValueError, "DataLoader with IterableDataset: expected unspecified sampler", STREAM,
     dict(sampler=SequentialSampler(STREAM))),
    (ValueError, "DataLoader with IterableDataset: expected unspecified sampler", STREAM, dict(sampler=3)),
    (ValueError, "DataLoader with IterableDataset: expected unspecified batch_sampler", STREAM,
     dict(batch_sampler=BatchSampler(SequentialSampler(STREAM), 3, False))),
    (ValueError, "DataLoader with IterableDataset: expected unspecified batch_sampler", STREAM, dict(batch_sampler=3)),
    (ValueError, "batch_size should be a positive integer value", DATA, dict(batch_size=0)),
    (ValueError, "drop_last should be a boolean value", DATA, dict(drop_last="y")),
    (ValueError, "prefetch_factor option could only be specified in multiprocessing", DATA,
     dict(prefetch_factor=2, num_workers=0)),
    (ValueError, "prefetch_factor option should be non-negative", DATA, dict(prefetch_factor=-1, num_workers=2)),
    (ValueError, "persistent_workers option needs num_workers > 0", DATA, dict(persistent_workers=True, num_workers=0)),
]


class DataLoaderMessages(unittest.TestCase):
    """PyTorch's own assertions on DataLoader's messages, run against make_loader as written for DataLoader."""

    def test_make_loader_raises_what_dataloader_raises_in_its_words_then_the_fix(self):
        for kind, regex, dataset, kwargs in DATALOADER_MESSAGES:
            with self.subTest(regex=regex, kwargs=kwargs):
                with self.assertRaisesRegex(kind, regex):  # the assertion, as PyTorch's test makes it
                    DataLoader(dataset, **kwargs)
                with self.assertRaisesRegex(kind, regex) as ours:
                    make_loader(dataset, cache=False, **kwargs)
                with self.assertRaises(kind) as theirs:
                    DataLoader(dataset, **kwargs)
                said, fix = str(theirs.exception), str(ours.exception)
                assert fix.startswith(said) and len(fix) > len(said) + 10, (said, fix)  # its words, then the fix


def test_messages_name_the_argument_and_the_fix():
    for kwargs, says in [(dict(timeout=-1), "got timeout=-1, pass a number of seconds >= 0"),
                         (dict(batch_size=8.0), "pass a positive int such as batch_size=32"),
                         (dict(batch_size=None, drop_last=True), "leave drop_last=False, or pass a batch_size"),
                         (dict(sampler=SAMPLER, shuffle=True), "Use shuffle=False, or a shuffling sampler"),
                         (dict(num_workers=0, prefetch_factor=2), "Drop prefetch_factor, or set num_workers > 0"),
                         (dict(num_workers=-1), "pass an int >= 0, or leave it out to let autoloader tune it"),
                         (dict(multiprocessing_context="bogus"), "valid start method in ['fork'")]:
        with pytest.raises((ValueError, TypeError), match=re.escape(says)):
            make_loader(DATA, cache=False, **kwargs)
    with pytest.raises(ValueError, match="leave shuffle unset and shuffle inside the dataset's __iter__"):
        make_loader(Stream(), shuffle=True, cache=False)

"""The random states that decide what a loader yields: taken, put back, and written as JSON-safe text.

Two kinds (NOTE [ Exact resume ] in state.py says which a checkpoint holds and when each is put back):
- the *ambient* RNGs, shared by the loader and the training loop: torch's global CPU generator, Python's ``random``
  and numpy's global ``RandomState`` (a sampler without a generator, a dataset augmenting in the main process and
  the loop's own dropout all draw from them);
- the loader's *own*: every ``torch.Generator`` on the loader, its sampler, its batch sampler and the batch sampler's
  sampler (each once), and the ``state_dict()`` of a sampler or batch sampler that has one.

``preserved(parts)`` wraps work that must leave all of them as it found them (tuning trials, which iterate the
user's sampler and run the user's step; with CUDA initialised, the GPUs' generators too).
"""
from __future__ import annotations

import base64
import contextlib
import random
from dataclasses import dataclass, field
from typing import Any, Dict, Iterator, Mapping, Optional, Tuple, cast

import numpy as np
import torch

ROLES = ("loader", "sampler", "batch_sampler", "batch_sampler.sampler")
_TORCH_STATE_BYTES = int(torch.get_rng_state().numel())
_PY_WORDS = 625  # random.getstate(): version 3, 624 Mersenne Twister words and the position
_NP_WORDS = 624


class StateError(ValueError):
    """A saved random state that cannot be put back (``where`` names it): damaged, or from another program."""


def parts_of(loader: Any) -> Dict[str, Any]:
    """The objects that may hold a loader's randomness, by role: the loader, its sampler, batch sampler and the batch
    sampler's sampler (None where absent)."""
    batch_sampler = getattr(loader, "batch_sampler", None)
    return {"loader": loader, "sampler": getattr(loader, "sampler", None), "batch_sampler": batch_sampler,
            "batch_sampler.sampler": getattr(batch_sampler, "sampler", None)}


def parts_of_kwargs(kwargs: Mapping[str, Any]) -> Dict[str, Any]:
    """``parts_of`` for DataLoader keywords not yet made into a DataLoader (a generator, sampler, batch_sampler)."""
    holder = type("Keywords", (), {"generator": kwargs.get("generator")})()
    batch_sampler = kwargs.get("batch_sampler")
    return {"loader": holder, "sampler": kwargs.get("sampler"), "batch_sampler": batch_sampler,
            "batch_sampler.sampler": getattr(batch_sampler, "sampler", None)}


def generators(parts: Mapping[str, Any]) -> Dict[str, torch.Generator]:
    """Each distinct ``torch.Generator`` of ``parts``, under the first role that holds it."""
    found: Dict[str, torch.Generator] = {}
    for role, part in parts.items():
        gen = getattr(part, "generator", None)
        if isinstance(gen, torch.Generator) and all(gen is not g for g in found.values()):
            found[role] = gen
    return found


def stateful_samplers(parts: Mapping[str, Any]) -> Dict[str, Any]:
    """The samplers of ``parts`` with both ``state_dict`` and ``load_state_dict``, each once."""
    found: Dict[str, Any] = {}
    for role, part in parts.items():
        if role != "loader" and part is not None and callable(getattr(part, "state_dict", None)) \
                and callable(getattr(part, "load_state_dict", None)) and all(part is not p for p in found.values()):
            found[role] = part
    return found


@dataclass(frozen=True)
class Ambient:
    """torch's global CPU RNG, Python's ``random`` and numpy's global RNG, as taken by ``Ambient.take()``."""

    torch_state: torch.Tensor
    python: Tuple[Any, ...]
    numpy: Tuple[Any, ...]

    @classmethod
    def take(cls) -> "Ambient":
        # the global RandomState is an MT19937, whose get_state() is the legacy tuple (numpy's stubs say a dict)
        return cls(torch.get_rng_state(), random.getstate(), cast(Tuple[Any, ...], np.random.get_state()))

    def put(self) -> None:
        torch.set_rng_state(self.torch_state)
        random.setstate(self.python)
        np.random.set_state(self.numpy)

    def to_json(self) -> Dict[str, Any]:
        version, words, gauss = self.python
        _, keys, pos, has_gauss, cached = self.numpy
        return {"torch": _b64(self.torch_state.numpy().tobytes()),
                "python": {"version": int(version), "words": _b64(np.asarray(words, dtype=np.uint32).tobytes()),
                           "gauss": gauss},
                "numpy": {"keys": _b64(np.asarray(keys, dtype=np.uint32).tobytes()), "pos": int(pos),
                          "has_gauss": int(has_gauss), "gauss": float(cached)}}

    @classmethod
    def from_json(cls, data: Any, where: str) -> "Ambient":
        _need(data, dict, where)
        torch_state = _rng_bytes(data.get("torch"), f"{where}['torch']", _TORCH_STATE_BYTES)
        py = data.get("python")
        _need(py, dict, f"{where}['python']")
        words = np.frombuffer(_rng_bytes(py.get("words"), f"{where}['python']['words']", 4 * _PY_WORDS), np.uint32)
        gauss = py.get("gauss")
        if py.get("version") != 3 or not (gauss is None or isinstance(gauss, float)) or words[-1] > _NP_WORDS:
            raise StateError(f"{where}['python'] is not a state of Python's random module")
        npy = data.get("numpy")
        _need(npy, dict, f"{where}['numpy']")
        keys = np.frombuffer(_rng_bytes(npy.get("keys"), f"{where}['numpy']['keys']", 4 * _NP_WORDS), np.uint32)
        pos, has_gauss, cached = npy.get("pos"), npy.get("has_gauss"), npy.get("gauss")
        if not (_is_int(pos) and 0 <= pos <= _NP_WORDS and has_gauss in (0, 1) and isinstance(cached, float)):
            raise StateError(f"{where}['numpy'] is not a state of numpy's global RNG")
        return cls(torch.frombuffer(bytearray(torch_state), dtype=torch.uint8),
                   (3, tuple(int(w) for w in words), gauss), ("MT19937", keys.copy(), pos, has_gauss, cached))


@dataclass(frozen=True)
class RngState:
    """A loader's random state: the ambient RNGs and the loader's own (see the module docstring)."""

    ambient: Ambient
    generators: Dict[str, torch.Tensor] = field(default_factory=dict)
    samplers: Optional[Dict[str, Any]] = None
    """The samplers' own ``state_dict()``; None when not taken."""

    @classmethod
    def take(cls, parts: Mapping[str, Any], *, samplers: bool) -> "RngState":
        return cls(Ambient.take(), {role: g.get_state() for role, g in generators(parts).items()},
                   {role: s.state_dict() for role, s in stateful_samplers(parts).items()} if samplers else None)

    def put(self, parts: Mapping[str, Any], *, samplers: bool = True) -> None:
        """Put every state back on ``parts`` (the samplers' only with ``samplers`` and when taken)."""
        here = generators(parts)
        missing = sorted(set(self.generators) - set(here))
        if missing:
            raise ValueError(f"the saved loader state has a generator on {missing} but this loader has none there: "
                             f"pass the same generator= (DataLoader or sampler) as the run that saved it")
        self.ambient.put()
        for role, state in self.generators.items():
            here[role].set_state(state)
        if samplers and self.samplers:
            owners = stateful_samplers(parts)
            for role, state in self.samplers.items():
                if role not in owners:
                    raise ValueError(f"the saved loader state holds the state_dict() of a {role} but this loader's "
                                     f"{role} has no load_state_dict(): pass the same sampler as the run that saved it")
                try:
                    owners[role].load_state_dict(state)
                except (KeyError, TypeError, ValueError, AttributeError, IndexError) as exc:
                    raise ValueError(f"the {role}'s load_state_dict() rejected its saved state ({type(exc).__name__}: "
                                     f"{exc}): the state is damaged or belongs to another sampler; load the saved "
                                     f"state unchanged, or start without the state") from exc

    def to_json(self) -> Dict[str, Any]:
        return {"ambient": self.ambient.to_json(),
                "generators": {role: _b64(g.numpy().tobytes()) for role, g in self.generators.items()},
                "samplers": self.samplers}

    @classmethod
    def from_json(cls, data: Any, where: str) -> "RngState":
        _need(data, dict, where)
        gens = data.get("generators")
        _need(gens, dict, f"{where}['generators']")
        decoded = {}
        for role, text in gens.items():
            if role not in ROLES:
                raise StateError(f"{where}['generators'] names {role!r}, which is none of {ROLES}")
            raw = _rng_bytes(text, f"{where}['generators'][{role!r}]", _TORCH_STATE_BYTES)
            decoded[role] = torch.frombuffer(bytearray(raw), dtype=torch.uint8)
        if "samplers" not in data:  # not digested: absent would read as "not taken" and drop the samplers' states
            raise StateError(f"{where} has no 'samplers' (None when they were not taken)")
        samplers = data["samplers"]
        if samplers is not None:
            _need(samplers, dict, f"{where}['samplers']")
        return cls(Ambient.from_json(data.get("ambient"), f"{where}['ambient']"), decoded, samplers)


@contextlib.contextmanager
def preserved(parts: Mapping[str, Any]) -> Iterator[None]:
    """Leave every random state of ``parts`` (and the ambient RNGs, and the GPUs' generators when CUDA is initialised)
    as it was, however the block ends."""
    taken = RngState.take(parts, samplers=True)
    cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_available() and torch.cuda.is_initialized() else None
    try:
        yield
    finally:
        taken.put(parts)
        if cuda is not None:
            torch.cuda.set_rng_state_all(cuda)


def _b64(raw: bytes) -> str:
    return base64.b64encode(raw).decode("ascii")


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _need(value: Any, kind: type, where: str) -> None:
    if not isinstance(value, kind):
        raise StateError(f"{where} must be a {kind.__name__}, got {type(value).__name__}")


def _rng_bytes(text: Any, where: str, size: int) -> bytes:
    if not isinstance(text, str):
        raise StateError(f"{where} must be base64 text, got {type(text).__name__}")
    try:
        raw = base64.b64decode(text.encode("ascii"), validate=True)
    except (ValueError, UnicodeEncodeError) as exc:
        raise StateError(f"{where} is not base64 text ({exc})") from None
    if len(raw) != size:
        raise StateError(f"{where} holds {len(raw)} bytes, a generator state of this torch build holds {size}")
    return raw

"""What a DataLoader-like source of several DataLoaders answers as the DataLoader it stands for (NOTE [ What
frameworks read ] in loader/mirror.py): its length, attributes and ``worker_init_fn``, those of ``plain``, the
DataLoader of the configuration in force."""
from __future__ import annotations

from typing import Any

from torch.utils.data import DataLoader


class DataLoaderStandIn:
    """Mixed into ``OnlineLoader``: ``plain`` is the DataLoader in force; ``_overrides`` what every DataLoader the
    source builds from now on gets (a ``worker_init_fn`` set by a framework)."""

    plain: DataLoader
    _overrides: dict

    def __len__(self) -> int:
        return len(self.plain)

    def __getattr__(self, name: str) -> Any:
        """The plain DataLoader's attributes (dataset, sampler, batch_sampler, batch_size, generator, ...)."""
        if name.startswith("__") or name in ("plain", "_overrides", "_steady_loader"):
            raise AttributeError(name)
        return getattr(self.plain, name)

    @property
    def worker_init_fn(self) -> Any:
        return self.plain.worker_init_fn

    @worker_init_fn.setter
    def worker_init_fn(self, value: Any) -> None:
        """Set on every DataLoader this source builds from now on (Lightning's ``seed_everything(workers=True)``)."""
        self._overrides["worker_init_fn"] = value
        self.plain.worker_init_fn = value

    @property
    def serving_loader(self) -> DataLoader:
        """The DataLoader whose persistent workers outlive an epoch (the source's own choice; ``plain`` here)."""
        return self.plain

    @property
    def _iterator(self) -> Any:
        """The persistent-workers iterator of ``serving_loader`` (Lightning shuts its workers down through it)."""
        return self.serving_loader._iterator

    @_iterator.setter
    def _iterator(self, value: Any) -> None:
        self.serving_loader._iterator = value

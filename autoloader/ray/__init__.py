"""The Ray Data engine: ``make_loader(dataset, engine="ray", address=...)`` returns the same ``PrefetchLoader`` over a
``RaySource`` whose batches Ray Data loads and collates, in the order autoloader draws (NOTE [ Exact batches through
Ray ] in source.py), with the pool tuned against the step (NOTE [ Sizing the Ray pool ] in plan.py). Importing this
package does not import Ray: only making or iterating such a loader does (the ``ray`` extra: ``pip install
".[ray]"`` in autoloader's checkout)."""
from .session import shutdown

__all__ = ["shutdown"]

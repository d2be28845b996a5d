"""torch's backend autoloading entry point: ``init_process_group("topocc")`` with no ``import topocc`` in the script.

torch >= 2.5 calls every entry point of the group ``torch.backends`` at the end of
``import torch`` (unless ``TORCH_DEVICE_BACKEND_AUTOLOAD=0``); pyproject.toml
names :func:`register` there.  It runs in every torch program of the
environment, so it registers the backend's name and nothing more: the runtime
(:mod:`topocc.runtime.distributed`: numpy, the executor, the transports) is
loaded by the first ``topocc`` process group, and ``import torch`` costs no
more than before.  It lives at the package's top because importing a module
first runs its parents' ``__init__``, and ``topocc``'s loads nothing.
"""

from __future__ import annotations

from typing import Any

__all__ = ["register"]

#: The name ``init_process_group`` takes (``topocc.runtime.distributed.BACKEND``).
BACKEND = "topocc"


def _create(options: Any, backend_options: Any) -> Any:
    """Make a ``topocc`` process group: load the runtime and hand over to its constructor."""
    from topocc.runtime.distributed import create_backend  # torch's backend, loaded by the first topocc group

    return create_backend(options, backend_options)


def register() -> None:
    """Register ``topocc`` with torch.distributed (idempotent; nothing where torch has no distributed package)."""
    import torch.distributed as dist  # torch, which is loading: its distributed package was imported before us

    if not dist.is_available() or BACKEND.upper() in dist.Backend._plugins:
        return
    dist.Backend.register_backend(BACKEND, _create, extended_api=True, devices=["cpu", "cuda"])

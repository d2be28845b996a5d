"""Shared fixtures: where the repository, its shipped topologies and ../shared live."""

from __future__ import annotations

from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
TOPOLOGIES = REPO / "topologies"
SHARED = REPO.parent / "shared"


@pytest.fixture(scope="session")
def shared_dir() -> Path:
    """``../shared`` beside the repository; tests that need it skip where it is absent (a user's clone)."""
    if not SHARED.is_dir():
        pytest.skip("../shared (reference inputs beside the repository) is absent in this checkout")
    return SHARED

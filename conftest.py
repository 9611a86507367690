"""Repository-wide pytest hooks (core, plugin and contrib tests alike)."""

from __future__ import annotations

import pytest


def pytest_collection_modifyitems(config, items):
    """Skip `@pytest.mark.gpu` tests where CUDA is not available."""
    try:
        import torch

        has_cuda = torch.cuda.is_available()
    except ImportError:  # pragma: no cover
        has_cuda = False
    if has_cuda:
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)

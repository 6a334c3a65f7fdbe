"""Comparing what came back from the server with what the same code gives locally."""

from __future__ import annotations

from typing import Any

import torch


def assert_same(remote: Any, local: Any, path: str = "value") -> None:
    """Equal structure; tensors allclose (exactly equal for integer dtypes)."""
    if isinstance(local, torch.Tensor):
        assert isinstance(remote, torch.Tensor), f"{path}: {type(remote).__name__} is not a tensor"
        assert remote.shape == local.shape, f"{path}: shape {remote.shape} != {local.shape}"
        assert remote.dtype == local.dtype, f"{path}: dtype {remote.dtype} != {local.dtype}"
        if local.is_floating_point():
            torch.testing.assert_close(remote.detach(), local.detach(), rtol=1e-5, atol=1e-6)
        else:
            assert torch.equal(remote, local), f"{path}: {remote} != {local}"
    elif isinstance(local, dict):
        assert isinstance(remote, dict) and remote.keys() == local.keys(), f"{path}: keys differ"
        for key in local:
            assert_same(remote[key], local[key], f"{path}[{key!r}]")
    elif isinstance(local, (list, tuple)):
        assert type(remote) is type(local), f"{path}: {type(remote)} != {type(local)}"
        assert len(remote) == len(local), f"{path}: length {len(remote)} != {len(local)}"
        for index, (a, b) in enumerate(zip(remote, local)):
            assert_same(a, b, f"{path}[{index}]")
    else:
        assert remote == local, f"{path}: {remote!r} != {local!r}"

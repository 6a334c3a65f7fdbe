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


def assert_identical(remote: Any, local: Any, path: str = "value") -> None:
    """Same type at every nesting level, then the same contents (floats allclose).

    Stricter than `assert_same`: a model output class that came back as a
    plain dict, a ``torch.Size`` as a tuple or a named tuple as a tuple fails.
    """
    import dataclasses
    import enum
    import math

    import numpy as np

    assert type(remote) is type(local), (
        f"{path}: {type(remote).__module__}.{type(remote).__qualname__} != "
        f"{type(local).__module__}.{type(local).__qualname__}"
    )
    if isinstance(local, torch.Tensor):
        assert_same(remote, local, path)
        assert remote.requires_grad == local.requires_grad, f"{path}: requires_grad differs"
    elif isinstance(local, np.ndarray):
        assert remote.dtype == local.dtype and remote.shape == local.shape, f"{path}: dtype/shape"
        np.testing.assert_allclose(remote, local, rtol=1e-5, atol=1e-6, err_msg=path)
    elif isinstance(local, np.generic):
        np.testing.assert_allclose(remote, local, rtol=1e-5, atol=1e-6, err_msg=path)
    elif dataclasses.is_dataclass(local) or isinstance(local, dict):
        if dataclasses.is_dataclass(local):
            for item in dataclasses.fields(local):
                assert_identical(getattr(remote, item.name), getattr(local, item.name), f"{path}.{item.name}")
        if isinstance(local, dict):
            assert list(remote.keys()) == list(local.keys()), f"{path}: keys {list(remote)} != {list(local)}"
            for key in local:
                assert_identical(remote[key], local[key], f"{path}[{key!r}]")
    elif isinstance(local, (list, tuple)):
        assert len(remote) == len(local), f"{path}: length {len(remote)} != {len(local)}"
        for index, (a, b) in enumerate(zip(remote, local)):
            assert_identical(a, b, f"{path}[{index}]")
    elif isinstance(local, float):
        assert math.isclose(remote, local, rel_tol=1e-5, abs_tol=1e-6), f"{path}: {remote} != {local}"
    elif isinstance(local, enum.Enum):
        assert remote is local, f"{path}: {remote!r} is not the member {local!r}"
    elif isinstance(local, (str, bytes, int, complex, type(None), torch.dtype, torch.device)):
        assert remote == local, f"{path}: {remote!r} != {local!r}"
    elif hasattr(local, "__dict__"):  # any other object (a cache): the same attributes
        assert_identical(dict(vars(remote)), dict(vars(local)), f"{path}.__dict__")
    else:
        assert remote == local, f"{path}: {remote!r} != {local!r}"

"""The host's side of the mapped design's weights, without a server: re-pointing parameters into one image.

On a GPU the host copies every parameter of a device into one exported
allocation and re-points its own parameters there (`weights.mapped.point_into`).
The first run on an H200 failed there on GPT-2's tied embedding, one
parameter object listed under two names. The re-pointing is the same on any
device, so it is checked here on the CPU with an image made of a plain tensor.
"""

from __future__ import annotations

import torch

from nnhost.execution.weights.mapped import point_into


class Tied(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(11, 6)
        self.middle = torch.nn.Linear(6, 6)
        self.head = torch.nn.Linear(6, 11, bias=False)
        self.head.weight = self.embed.weight  # one object under two names, as transformers ties them


def _image(members: list[torch.Tensor]) -> tuple[torch.Tensor, dict[int, int]]:
    """What export does on a device: one uint8 image holding every storage, and where each starts."""
    storages = {t.untyped_storage().data_ptr(): t for t in members}
    offsets, size = {}, 0
    for key, tensor in storages.items():
        offsets[key] = size
        size += -(-tensor.untyped_storage().nbytes() // 64) * 64
    whole = torch.zeros(size, dtype=torch.uint8)
    for key, tensor in storages.items():
        raw = torch.empty(0, dtype=torch.uint8).set_(tensor.untyped_storage())
        whole[offsets[key]:offsets[key] + raw.numel()].copy_(raw)
    return whole, offsets


def test_tied_parameters_are_moved_once_and_stay_tied() -> None:
    torch.manual_seed(0)
    model = Tied()
    before = {name: p.detach().clone() for name, p in model.named_parameters(remove_duplicate=False)}
    members = [p for _, p in model.named_parameters(remove_duplicate=False)]
    assert len(members) > len(set(map(id, members)))  # the case that failed: a parameter listed twice
    whole, offsets = _image(members)

    point_into(members, whole, offsets)

    for name, parameter in model.named_parameters(remove_duplicate=False):
        assert parameter.untyped_storage().data_ptr() == whole.untyped_storage().data_ptr(), name
        assert torch.equal(parameter, before[name]), name
    assert model.head.weight is model.embed.weight
    out = model.head(model.middle(model.embed(torch.tensor([1, 2, 3]))))
    assert out.shape == (3, 11)


def test_views_of_one_storage_keep_their_offsets() -> None:
    base = torch.arange(24, dtype=torch.float32)
    first = torch.nn.Parameter(base[:12].view(3, 4))
    second = torch.nn.Parameter(base[12:].view(4, 3))
    assert first.untyped_storage().data_ptr() == second.untyped_storage().data_ptr()
    whole, offsets = _image([first, second])

    point_into([first, second], whole, offsets)

    assert torch.equal(first, torch.arange(12, dtype=torch.float32).view(3, 4))
    assert torch.equal(second, torch.arange(12, 24, dtype=torch.float32).view(4, 3))

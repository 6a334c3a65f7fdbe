"""Memory a request allocates uninitialised never shows an earlier request's values.

One user's job fills large tensors with a recognisable pattern and lets them
go; the next job, from another user, allocates with every spelling of the
empty family it may use and looks at what it got. None of it may hold the
pattern, and what the patched constructors return (storages from a size,
numpy's empties) must be zero. Both jobs go through the real client to the
real contained server. On this CPU-only torch each job has a process of its
own, which runs without the dispatch mode (`fresh_memory.blanking_needed`):
were the two jobs ever to share a process, the pattern would show.

The mode itself (what a process that can meet another request's memory, on
an accelerator or serving several jobs, runs every job under) is exercised
directly: it blanks every spelling of the empty family, and refuses writes
into weights held off the host (CPU tensors marked as protected here).
"""

from __future__ import annotations

import warnings

import nnsight
import pytest
import torch
from conftest import API_KEY

from .helpers import PROMPT

PATTERN = 1234.5
SIZES = (7, 300, 4096, 1 << 16, 1 << 20)


def fill_and_free(model, url):
    with model.trace(PROMPT, remote=url):
        kept = 0
        for size in (7, 300, 4096, 1 << 16, 1 << 20, 1 << 22):
            for _ in range(3):
                block = torch.full((size,), 1234.5)
                block.mul_(1.0)
                kept += int(block[0] == 1234.5)
        import numpy

        for _ in range(8):
            small = numpy.full(16, 1234.5)
        hidden = model.transformer.h[0].output[0]
        hidden.fill_(1234.5)
        filled = nnsight.save(kept)


def allocate_everything(model, url):
    with model.trace(PROMPT, remote=url):
        import numpy

        found = {}
        for size in (7, 300, 4096, 1 << 16, 1 << 20):
            got = {
                "torch.empty": torch.empty(size),
                "torch.empty_like": torch.empty_like(torch.ones(size)),
                "Tensor.new_empty": torch.ones(1).new_empty(size),
                "torch.empty_strided": torch.empty_strided((size,), (1,)),
                "torch.Tensor(n)": torch.Tensor(size),
                "torch.FloatTensor(n)": torch.FloatTensor(size),
                "Tensor.new(n)": torch.ones(1).new(size),
                "torch.ops.aten.empty": torch.ops.aten.empty.memory_format([size]),
                "torch.UntypedStorage(n)": torch.tensor([]).set_(torch.UntypedStorage(size * 4)),
                "numpy.empty": torch.from_numpy(numpy.empty(size, dtype=numpy.float32)),
                "numpy.empty_like": torch.from_numpy(numpy.empty_like(numpy.ones(size, dtype=numpy.float32))),
            }
            grown = torch.ones(1)
            grown.resize_(size + 1)
            got["Tensor.resize_"] = grown[1:]
            storage = torch.ones(1).untyped_storage()
            storage.resize_(4 * (size + 1))
            got["UntypedStorage.resize_"] = torch.tensor([]).set_(storage)[1:]
            for name, tensor in got.items():
                entry = found.setdefault(name, [0, 0])
                entry[0] += int((tensor.float() == 1234.5).sum())
                entry[1] += int(torch.count_nonzero(tensor))
        found = nnsight.save(found)
    return found


#: Spellings that go around the dispatcher: patched in every process, so blank everywhere.
PATCHED = ("torch.UntypedStorage(n)", "UntypedStorage.resize_", "numpy.empty", "numpy.empty_like")


def test_a_later_users_empty_allocations_never_show_the_earlier_job(serving, remote_model):
    from test_accounts import as_client, make_user

    other = make_user(serving, "mallory-uninitialised@example.org")
    for _ in range(2):
        with as_client(serving, API_KEY):
            fill_and_free(remote_model, serving.url)
        with as_client(serving, other):
            found = allocate_everything(remote_model, serving.url)
        assert set(found) >= {"torch.empty", "Tensor.resize_", "torch.UntypedStorage(n)", "numpy.empty"}
        for name, (pattern, nonzero) in found.items():
            assert pattern == 0, f"{name} showed the previous job's values ({pattern} elements)"
            if name in PATCHED:
                assert nonzero == 0, f"{name} returned {nonzero} non-zero elements: not blank"


# --- the mode itself, in this process ---------------------------------------------------


def test_the_mode_blanks_every_spelling_of_the_empty_family():
    from nnhost.execution.guard.fresh_memory import job_memory

    size = 1 << 16
    for _ in range(4):  # freed blocks of the sizes asked for below, full of the pattern
        torch.full((size,), PATTERN).mul_(1.0)
        torch.full((size + 1,), PATTERN).mul_(1.0)
    with job_memory():
        grown = torch.ones(1)
        grown.resize_(size + 1)
        got = {
            "torch.empty": torch.empty(size),
            "torch.empty_like": torch.empty_like(torch.ones(size)),
            "Tensor.new_empty": torch.ones(1).new_empty(size),
            "torch.empty_strided": torch.empty_strided((size,), (1,)),
            "torch.Tensor(n)": torch.Tensor(size),
            "torch.FloatTensor(n)": torch.FloatTensor(size),
            "torch.ops.aten.empty": torch.ops.aten.empty.memory_format([size]),
            "Tensor.resize_": grown[1:],
        }
    for name, tensor in got.items():
        assert int(torch.count_nonzero(tensor)) == 0, f"{name} is not blank under the mode"


def test_only_a_job_alone_in_its_process_on_a_cpu_torch_goes_without_the_mode():
    from nnhost.execution.guard.fresh_memory import accelerator_reachable, blanking_needed

    assert not accelerator_reachable()  # this suite's torch is the CPU build
    assert not blanking_needed(frozenset(), sole_job=True)
    assert blanking_needed(frozenset(), sole_job=False)  # a process that serves more jobs
    assert blanking_needed(frozenset({1}), sole_job=True)  # weights on an accelerator to protect


def test_writes_into_protected_storages_are_refused_before_they_happen():
    from nnhost.execution.guard.fresh_memory import WeightWriteRefused, job_memory

    weight = torch.nn.Parameter(torch.ones(8, 8), requires_grad=False)
    protected = frozenset({weight.untyped_storage().data_ptr()})
    writes = [
        lambda: weight.data.zero_(),
        lambda: weight[:2].add_(1.0),
        lambda: weight.detach().copy_(torch.zeros(8, 8)),
        lambda: torch.add(torch.ones(8, 8), 1.0, out=weight.data),
        lambda: torch.ops.aten.fill_.Scalar(weight.data, 3.0),
    ]
    for write in writes:
        with job_memory(protected), pytest.raises(WeightWriteRefused, match="read-only on this server"):
            write()
    assert torch.equal(weight, torch.ones(8, 8))
    with job_memory(protected):
        copy = weight.clone().add_(1.0)  # a copy is the user's own
        out = weight @ weight
    assert torch.equal(copy, torch.full((8, 8), 2.0)) and torch.equal(out, torch.full((8, 8), 8.0))


def test_the_seal_and_the_fingerprint_see_what_the_mode_does_not(test_snapshot):
    """Outside the mode a `.data` write escapes the version counter; the full check sees it."""
    from nnsight import LanguageModel

    from nnhost.execution.guard.integrity import ModelGuard

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = LanguageModel(str(test_snapshot), dispatch=True)
    for parameter in model._module.parameters():
        parameter.requires_grad_(False)
    guard = ModelGuard(model, model._remoteable_persistent_objects(), read_only_weights=False)
    with model.trace(PROMPT):
        logits = model.lm_head.output.save()
    assert not guard.restore().fatal and guard.verify_weights(force=True) == []
    block = model._module.transformer.h[0]
    with torch.no_grad():
        block.mlp.c_fc.weight[0, 0] += 1.0
    assert "a weight's values changed" in guard.restore().fatal
    guard.rebaseline()
    block.attn.c_proj.weight.data[0, 0] += 1.0  # .data has its own version counter
    assert not guard.restore().fatal
    assert guard.verify_weights() == []  # not due yet: the full check runs on its schedule
    assert guard.verify_weights(force=True) == ["Conv1D.weight"]


def test_the_fingerprint_needs_no_temporaries_the_size_of_the_tensor():
    from nnhost.execution.weights import cpu as weights

    tensor = torch.randn(1000, 37).to(torch.bfloat16)
    assert weights.fingerprint(tensor, chunk=1000) == weights.fingerprint(tensor.clone(), chunk=1000)
    changed = tensor.clone()
    changed[999, 36] = 0.5
    assert weights.fingerprint(changed, chunk=1000) != weights.fingerprint(tensor, chunk=1000)
    swapped = tensor.clone()
    swapped[0, 0], swapped[0, 1] = tensor[0, 1], tensor[0, 0]
    if tensor[0, 0] != tensor[0, 1]:
        assert weights.fingerprint(swapped, chunk=1000) != weights.fingerprint(tensor, chunk=1000)
    # Temporaries are bounded by the chunk: no step sees more elements than it.
    seen = []
    original = weights._positions

    def spy(device, count):
        seen.append(count)
        return original(device, count)

    weights._positions = spy
    try:
        weights.fingerprint(torch.zeros(10_000, dtype=torch.bfloat16), chunk=1024)
    finally:
        weights._positions = original
    assert len(seen) == 10 and max(seen) == 1024

"""Load options and per-device memory accounting for models on accelerators, on the CPU.

The devices named here ("cuda:0", "cuda:1") need not exist: the accounting is
arithmetic over the catalog and the budgets, and the load options are checked
by what reaches nnsight's loader.
"""

from __future__ import annotations

import asyncio
import warnings

import pytest
import torch
from fakes import FakeFleet

from nnhost.config import ModelEntry
from nnhost.controller.deployment import COLD, HOT, WARM
from nnhost.controller.manager import CannotFit, DeploymentManager
from nnhost.controller.placement import DeviceBudgets
from nnhost.models.catalog import Catalog, ModelSpec
from nnhost.models.sizing import QUANTIZATION_BYTES, device_shares, tensor_bytes

MiB = 1 << 20


def test_catalog_load_options_reach_the_loader_kwargs():
    spec = ModelEntry(**{
        "repo_id": "org/big", "dtype": "bfloat16", "quantization": "NF4",
        "device_map": {"transformer.h.0": "cuda:0", "transformer.h.1": "cuda:1", "lm_head": 1},
    }).spec()
    kwargs = spec.worker_load_kwargs()
    assert kwargs["dtype"] == "nf4" and kwargs["compute_dtype"] == "bfloat16"
    assert kwargs["device_map"] == {"transformer.h.0": 0, "transformer.h.1": 1, "lm_head": 1}
    auto = ModelEntry(**{"repo_id": "org/x", "device_map": "auto", "devices": ["cuda:0", "cuda:1"]}).spec()
    assert auto.worker_load_kwargs() == {"device_map": "auto"}
    assert ModelEntry(**{"repo_id": "org/y", "dtype": "float16"}).spec().worker_load_kwargs() == {"dtype": "float16"}


@pytest.mark.parametrize("table, complaint", [
    ({"quantization": "int3"}, "quantization 'int3' is not one nnsight 0.8.1 loads"),
    ({"dtype": "nf4"}, "write quantization = 'nf4'"),
    ({"device_map": "everywhere"}, "device_map must be one of auto"),
    ({"device_map": {"h.0": 1.5}}, "module names to devices"),
    ({"devices": ["cuda:0"]}, "devices goes with a device_map strategy"),
])
def test_bad_load_options_are_refused_with_what_to_write(table, complaint):
    with pytest.raises(ValueError, match=complaint):
        ModelEntry(**{"repo_id": "org/bad", **table})


def test_quantization_widths_match_nnsight():
    from nnsight.modeling.quantization import QUANTIZATIONS

    assert {name: q.bytes_per_element for name, q in QUANTIZATIONS.items()} == QUANTIZATION_BYTES


def test_shares_of_an_explicit_map_follow_the_tensors(test_snapshot):
    sizes = tensor_bytes(test_snapshot, "bfloat16")
    assert sum(sizes.values()) * 2 == sum(tensor_bytes(test_snapshot, "float32").values())
    assert sum(tensor_bytes(test_snapshot, "nf4").values()) < sum(sizes.values())
    shares = device_shares(
        sizes, {"transformer.wte": 0, "transformer.wpe": 0, "transformer.h.0": 0,
                "transformer.h.1": "cuda:1", "transformer.ln_f": 1, "lm_head": 0}, [], "cpu",
    )
    assert set(shares) == {"cuda:0", "cuda:1"} and sum(shares.values()) == sum(sizes.values())
    block = sum(size for name, size in sizes.items() if ".h.1." in f".{name}")
    final_norm = sum(size for name, size in sizes.items() if "ln_f" in name)
    assert shares["cuda:1"] == block + final_norm
    even = device_shares(sizes, "auto", ["cuda:0", "cuda:1"], "cpu")
    assert even["cuda:0"] == even["cuda:1"] >= sum(sizes.values()) // 2


def test_nnsight_loads_with_the_catalog_options(test_snapshot, server_hf_home, monkeypatch):
    """dtype and device_map reach from_pretrained through nnsight's own loader."""
    from nnsight.modeling.mixins.remotable import Remotable

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    spec = ModelEntry(**{
        "repo_id": str(test_snapshot), "dtype": "bfloat16",
        "device_map": {"transformer": "cpu", "lm_head": "cpu"},
    }).spec()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = Remotable.from_model_key(spec.model_key(), dispatch=True, **spec.worker_load_kwargs())
    assert {p.dtype for p in model._module.parameters()} == {torch.bfloat16}


def manager(specs, budgets):
    loop = asyncio.new_event_loop()
    catalog = Catalog(specs)
    made = DeploymentManager(
        catalog, loop=loop, on_job_event=lambda *a: None, on_change=lambda *a: None,
        has_work=lambda name: False, worker_environ={}, placement=DeviceBudgets(budgets),
        replica_factory=FakeFleet(),
    )
    return made, loop


def spread(name, shares, **extra):
    spec = ModelSpec(repo_id=name, device_map={f"m{i}": d for i, d in enumerate(shares)}, **extra)
    spec.size_bytes = sum(shares.values())
    spec.shares = dict(shares)
    return spec


def test_a_model_over_two_gpus_counts_against_each():
    big = spread("org/big", {"cuda:0": 60 * MiB, "cuda:1": 50 * MiB})
    small = ModelSpec(repo_id="org/small", device="cuda:1", size_bytes=40 * MiB)
    other = ModelSpec(repo_id="org/other", device="cuda:0", size_bytes=30 * MiB)
    deployments, loop = manager([big, small, other], {"cuda:0": 100 * MiB, "cuda:1": 100 * MiB, "cpu": 1 << 40})
    try:
        for name in ("org/small", "org/other"):
            deployments.get(name).target = HOT
        assert deployments.used("cuda:0") == 30 * MiB and deployments.used("cuda:1") == 40 * MiB
        deployments.get("org/big").target = HOT
        assert deployments.used("cuda:0") == 90 * MiB and deployments.used("cuda:1") == 90 * MiB
        assert deployments.get("org/big").shares() == {"cuda:0": 60 * MiB, "cuda:1": 50 * MiB}
        assert deployments.get("org/big").shares(WARM) == {"cpu": 110 * MiB}
        assert deployments.short_device(deployments.get("org/big"), HOT) is None
        # Another 20 MiB on cuda:1 fits beside everything; 20 more on cuda:0 does not.
        bigger = deployments.get("org/big")
        bigger.target = COLD
        bigger.spec.shares = {"cuda:0": 80 * MiB, "cuda:1": 50 * MiB}
        assert deployments.short_device(bigger, HOT) == "cuda:0"
        note = deployments.make_room(bigger, HOT)
        # Only the deployment on the short device is demoted, to WARM (the host has room).
        assert "org/other (now WARM)" in note and "org/small" not in note
        assert deployments.get("org/other").target == WARM and deployments.get("org/small").target == HOT
    finally:
        loop.close()


def test_a_share_over_one_gpus_whole_budget_cannot_fit():
    big = spread("org/big", {"cuda:0": 10 * MiB, "cuda:1": 200 * MiB})
    deployments, loop = manager([big], {"cuda:0": 100 * MiB, "cuda:1": 100 * MiB})
    try:
        with pytest.raises(CannotFit, match="on cuda:1, more than its whole budget"):
            deployments.make_room(deployments.get("org/big"), HOT)
    finally:
        loop.close()


def test_gpu_budgets_default_from_the_device(monkeypatch):
    from nnhost.config import Settings
    from nnhost.controller import devices

    asked = []

    def fake(names, timeout=120.0):
        asked.extend(names)
        return {"cuda:0": 80 * (1 << 30)}

    monkeypatch.setattr(devices, "gpu_memory", fake)
    catalog = Catalog([ModelSpec(repo_id="org/a", device="cuda:0", size_bytes=1),
                       ModelSpec(repo_id="org/b", device="cuda:1", size_bytes=1)])
    budgets = devices.memory_budgets(Settings(memory_budget={"cuda:1": "10GiB"}), catalog)
    assert asked == ["cuda:0"]  # a configured budget is not asked for
    assert budgets["cuda:0"] == int(80 * (1 << 30) * 0.9) and budgets["cuda:1"] == 10 * (1 << 30)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the answer where there is no GPU")
def test_the_device_probe_reports_nothing_without_a_gpu():
    from nnhost.controller.devices import gpu_memory

    assert gpu_memory(["cuda:0"]) == {}

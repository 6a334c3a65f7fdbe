"""Keeping the shared model as it was, from one request to the next, where one process serves many.

The guard serves the processes that run many jobs: trusted mode and
accelerators (every user's jobs, one after another, in the host), and a
contained job's process that runs its owner's next jobs (`job.process`,
``jobs_per_process``), where it keeps an honest user's next request as a
fresh process would find the model; there the weights are already sealed
(``weights_sealed``), and what the guard cannot undo ends the process.
`process_state.shared_state` lets a job's final message say what it changed.

Every request runs against the same loaded model, so whatever one request
changes the next one would inherit: a weight zeroed in place, a parameter
swapped for another tensor, a hook left on a module, a tokenizer setting, a
function of ``torch.nn.functional`` replaced, torch's default dtype or random
state. `ModelGuard` takes a snapshot once the model is loaded and, after every
job, puts back what changed and says what it was; what it cannot put back, it
reports as fatal, and the worker is restarted from the checkpoint.

How each kind of state is kept, and what it costs per job:

* **Weight values (CPU).** Moved once into read-only memory
  (`weights.WeightImage`): a write by any path is a fault, the worker is
  restarted with pristine weights, and the job that wrote fails with that
  reason. Nothing is checked per job and no second copy is kept. Buffers, which
  some models legitimately update in a forward pass, keep a pristine copy and
  are compared and restored.
* **Weight values (accelerators).** Per job, O(number of tensors): each
  parameter's version counter, data pointer and storage (`weights.WeightSeal`);
  writes through ``.data`` are refused as they happen (`fresh_memory`). A
  change is fatal. The exact fingerprint of every weight is compared off the
  request path (`verify_weights`: after a job's result has gone out, at most
  every ``WEIGHT_CHECK_INTERVAL`` seconds, or when the replica is idle).
* **Structure.** Each module's, the tokenizer's, the pipeline's, the config's
  and nnsight ``CONFIG``'s attribute dicts (one level into containers, so hooks
  registered in ``_forward_hooks`` count), every parameter's identity, storage,
  shape and ``requires_grad``: compared by identity and restored.
* **Library code.** The classes the model's forward pass runs through (its
  module classes and their bases, ``torch.Tensor``, nnsight's): compared and
  restored. Plain modules (``torch.nn.functional``, ...) refuse assignments
  made by user code as they happen (`guard_module_attributes`), so a library's
  own lazy writes to its modules are left alone.
* **Process state.** torch's default dtype, grad mode, threads, determinism,
  matmul precision and random state; numpy's random state; child processes a
  job started (stopped); threads it left behind (fatal).

The whole check takes a few milliseconds per job (it does not grow with the
weights): see ``benchmarks/containment.py``.

The snapshots of attribute dicts are `attribute_snapshots`; the process-wide
state is read and put back by `process_state`. This module decides what is
snapshotted and what is fatal, and must never let a change it could not undo
pass as undone.
"""

from __future__ import annotations

import sys
import threading
import time
import types
from typing import Any, Optional

from ..weights.cpu import WeightImage, WeightSeal, fingerprint
from .attribute_snapshots import AllKeys, DictSnapshot, attribute_namespace
from .process_state import child_processes, process_state, restore_process_state, stop_children
from .report import GuardReport

# --- modules refuse assignments from user code ----------------------------------------------


class _GuardedModule(types.ModuleType):
    """A module that refuses attribute writes made directly by user code.

    User code is recognised by its builtins: it runs with the sandbox's guarded
    builtins dict, which no library frame has. Library code (an import binding
    a submodule, a lazy cache) writes as usual.
    """

    _user_builtins: Optional[dict[str, Any]] = None

    def __setattr__(self, name: str, value: Any) -> None:
        if _from_user_code():
            raise AttributeError(
                f"modules are read-only in a request: cannot set {self.__name__}.{name}"
            )
        super().__setattr__(name, value)

    def __delattr__(self, name: str) -> None:
        if _from_user_code():
            raise AttributeError(
                f"modules are read-only in a request: cannot delete {self.__name__}.{name}"
            )
        super().__delattr__(name)


def _from_user_code() -> bool:
    builtins_dict = _GuardedModule._user_builtins
    return builtins_dict is not None and sys._getframe(2).f_builtins is builtins_dict


def guard_module_attributes(user_builtins: dict[str, Any]) -> int:
    """Make every plain module refuse writes from frames running ``user_builtins``."""
    _GuardedModule._user_builtins = user_builtins
    guarded = 0
    for module in list(sys.modules.values()):
        if type(module) is types.ModuleType:
            try:
                module.__class__ = _GuardedModule
                guarded += 1
            except TypeError:
                pass
    return guarded


# --- the guard -------------------------------------------------------------------------------


class ModelGuard:
    """Snapshot a loaded model and its surroundings; undo what each job changes."""

    def __init__(self, model: Any, persistent_objects: dict[str, Any], *, read_only_weights: bool = True,
                 weights_sealed: bool = False) -> None:
        """``weights_sealed``: the weights already lie in read-only memory (a job's
        process of the fork or mapped design): they are neither moved nor
        fingerprinted, as no write can reach them."""
        self.model = model
        self.persistent_objects = persistent_objects
        self.read_only_weights = read_only_weights and not weights_sealed
        self.weights_sealed = weights_sealed
        self.image: Optional[WeightImage] = None
        self.rebaseline()

    # -- the snapshot ----------------------------------------------------------------------

    def rebaseline(self) -> None:
        """Take the snapshot (again, e.g. after the weights moved to another device)."""
        import torch

        module = self.model._module
        parameters = list(module.parameters())
        self.image = None
        if self.read_only_weights and parameters and all(p.device.type == "cpu" for p in parameters):
            self.image = WeightImage.build(parameters)
        self.tensors = []
        for owner in module.modules():
            for kind in ("_parameters", "_buffers"):
                for name, tensor in getattr(owner, kind).items():
                    if tensor is not None:
                        self.tensors.append((owner, kind, name, tensor, tensor.data, _layout(tensor)))
        self.buffers = [
            (tensor, tensor.detach().clone()) for _, kind, _, tensor, _, _ in self.tensors
            if kind == "_buffers" and tensor.device.type == "cpu"
        ]
        self.seal: Optional[WeightSeal] = None
        self.fingerprints: list[tuple[str, Any, int]] = []
        if self.image is None and not self.weights_sealed:
            named, seen = [], set()
            for owner, kind, name, tensor, _, _ in self.tensors:
                if kind == "_parameters" and id(tensor) not in seen:
                    seen.add(id(tensor))
                    named.append((f"{type(owner).__name__}.{name}", tensor))
            self.seal = WeightSeal(named)
            # Taken once per placement (start-up, WARM to HOT), never per job.
            self.fingerprints = [(label, tensor, fingerprint(tensor)) for label, tensor in named]
        self.last_verified = time.monotonic()
        from .fresh_memory import protected_storages

        self._protected = protected_storages(tensor for _, tensor, _ in self.fingerprints)
        self.objects = [DictSnapshot(m, f"module {n or 'model'}") for n, m in module.named_modules()]
        for key, obj in self.persistent_objects.items():
            if not isinstance(obj, torch.nn.Module):
                # nnsight resets its interleaver's run state on every request:
                # it is put back all the same, but is not worth a word to the user.
                quiet = AllKeys() if key == "Interleaver" else ()
                self.objects.append(DictSnapshot(obj, key, quiet))
        for name in ("tokenizer", "pipeline", "config"):
            obj = getattr(self.model, name, None) if name != "config" else getattr(module, "config", None)
            if obj is not None and attribute_namespace(obj) is not None:
                if not any(snapshot.owner is obj for snapshot in self.objects):
                    self.objects.append(DictSnapshot(obj, name))
        try:  # nnsight's own settings object (e.g. CONFIG.APP.DEBUG, CONFIG.API.HOST)
            from nnsight import CONFIG  # type: ignore[import-untyped]

            for name, value in [("nnsight.CONFIG", CONFIG)] + [
                (f"nnsight.CONFIG.{key}", item) for key, item in vars(CONFIG).items()
            ]:
                if attribute_namespace(value) is not None:
                    self.objects.append(DictSnapshot(value, name))
        except ImportError:
            pass
        # Plain modules refuse writes from user code as they happen, so only
        # classes and the modules that could not be guarded are compared.
        self.namespaces = [
            DictSnapshot(owner, label)
            for owner, label in self._library_owners()
            if not isinstance(owner, _GuardedModule)
        ]
        self.adopt()

    def adopt(self) -> None:
        """Take again what belongs to the process: its state, threads and children.

        A job's process forked from the one that took the snapshot (the host
        of the fork design) shares the model's snapshot, but sets its own
        threads and torch's thread count up after the fork.
        """
        self.state = process_state()
        self.threads = threading.active_count()
        self.children = child_processes()

    def _library_owners(self) -> list[tuple[Any, str]]:
        import torch

        owners: dict[int, tuple[Any, str]] = {}

        def add(obj: Any) -> None:
            if obj is None or id(obj) in owners:
                return
            label = obj.__name__ if isinstance(obj, types.ModuleType) else f"{obj.__module__}.{obj.__qualname__}"
            owners[id(obj)] = (obj, label)

        classes: set[type] = {type(m) for m in self.model._module.modules()} | {torch.Tensor, type(self.model)}
        for cls in classes:
            for base in cls.__mro__:
                if base is object:
                    continue
                add(base)
                add(sys.modules.get(base.__module__))
        for name in ("torch", "torch.nn.functional", "torch.nn.init", "math"):
            add(sys.modules.get(name))
        for name, mod in list(sys.modules.items()):
            if name.startswith("nnsight") and isinstance(mod, types.ModuleType):
                add(mod)
        return list(owners.values())

    # -- the full check, off the request path --------------------------------------------------

    #: Seconds between full fingerprints of accelerator weights (see `verify_weights`).
    WEIGHT_CHECK_INTERVAL = 60.0

    def protected_storages(self) -> frozenset[int]:
        """Storages of the weights that are not in read-only memory (refused writes)."""
        return self._protected

    def verify_weights(self, force: bool = False) -> list[str]:
        """Compare every accelerator weight's exact fingerprint; the names that changed.

        Reads every weight once (chunked: see `weights.fingerprint`), so it runs
        when no job is waiting on it: after a job's result went out when the
        interval has passed (``force`` skips the wait), or when the replica is idle.
        """
        if not self.fingerprints or (
            not force and time.monotonic() - self.last_verified < self.WEIGHT_CHECK_INTERVAL
        ):
            return []
        changed = [label for label, tensor, expected in self.fingerprints if fingerprint(tensor) != expected]
        self.last_verified = time.monotonic()
        return changed

    # -- after a job -------------------------------------------------------------------------

    def restore(self) -> GuardReport:
        """Undo what the last job changed; the report says what, and what could not be."""
        import torch

        report = GuardReport()
        for snapshot in self.objects:
            snapshot.restore(report)
        for snapshot in self.namespaces:
            snapshot.restore(report, deep=False)
        with torch.no_grad():
            for owner, kind, name, tensor, data, layout in self.tensors:
                if _layout(tensor) != layout or tensor.data.data_ptr() != data.data_ptr():
                    tensor.data = data
                    tensor.requires_grad_(layout[-1])
                    report.restored.append(f"{kind[1:-1]} {name} of {type(owner).__name__}")
            for tensor, pristine in self.buffers:
                if not torch.equal(tensor, pristine):
                    tensor.copy_(pristine)
                    report.restored.append("buffer values")
        if self.seal is not None and self.seal.changed():
            report.fatal.append("a weight's values changed")
        restore_process_state(self.state, report)
        stopped = stop_children(self.children)
        if stopped:
            report.restored.append(f"stopped {stopped} process(es) the request left running")
        if threading.active_count() > self.threads:
            report.fatal.append("the request left a thread running")
        return report


def _layout(tensor: Any) -> tuple[Any, ...]:
    return (
        tuple(tensor.shape),
        tuple(tensor.stride()),
        tensor.dtype,
        str(tensor.device),
        tensor.storage_offset(),
        bool(tensor.requires_grad),
    )

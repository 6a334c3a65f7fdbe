"""Keeping the shared model as it was, from one request to the next, where one process serves many.

With a fresh process per job (a contained model on the CPU, see `host`) the
guard is not used: nothing a job changes outlives its process, and
`shared_state` only lets the final message say what it changed. The guard
serves the processes that run many jobs: trusted mode and accelerators.

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
"""

from __future__ import annotations

import os
import sys
import threading
import time
import types
from dataclasses import dataclass, field
from typing import Any, Iterable, Optional

from .weights import WeightImage, WeightSeal, fingerprint

_CONTAINERS = (dict, list, set)


@dataclass
class GuardReport:
    """What a job left changed, and whether the worker must be restarted."""

    restored: list[str] = field(default_factory=list)
    fatal: list[str] = field(default_factory=list)

    def describe(self) -> str:
        parts = []
        if self.fatal:
            parts.append("could not be undone: " + "; ".join(self.fatal[:5]))
        if self.restored:
            parts.append("undone: " + "; ".join(self.restored[:5]))
        return " ".join(parts)


# --- snapshots of attribute dicts --------------------------------------------------------


class _DictSnapshot:
    """Identity snapshot of one object's attribute dict, one level into containers."""

    __slots__ = ("owner", "name", "items", "contents", "quiet")

    def __init__(self, owner: Any, name: str, quiet: Iterable[str] = ()) -> None:
        self.owner = owner
        self.name = name
        #: Keys the library itself resets on every run: put back without a report.
        self.quiet = quiet if isinstance(quiet, frozenset) else frozenset(quiet)
        namespace = _namespace(owner)
        self.items = dict(namespace)
        self.contents = {
            key: (list(value.items()) if isinstance(value, dict) else list(value))
            for key, value in self.items.items()
            if type(value) in _CONTAINERS or isinstance(value, dict)
        }

    def restore(self, report: GuardReport, deep: bool = True) -> None:
        namespace = _namespace(self.owner)
        if namespace is None:
            return
        changed = []
        for key in [k for k in namespace if k not in self.items]:
            if key in _CACHES or isinstance(self.owner, types.ModuleType):
                # Written by the interpreter itself (copyreg, warnings), or a
                # submodule the import system bound on its package.
                continue
            if key not in self.quiet and not _inherited(self.owner, key, namespace[key]):
                changed.append(f"added {key}")
            _delete(self.owner, namespace, key)
        for key, value in self.items.items():
            if key not in namespace or not _same(namespace[key], value):
                if key not in self.quiet:
                    changed.append(f"replaced {key}")
                _assign(self.owner, namespace, key, value)
        if deep:
            for key, content in self.contents.items():
                container = self.items[key]
                if _same_contents(container, content):
                    continue
                if key not in self.quiet:
                    changed.append(f"changed {key}")
                if isinstance(container, dict):
                    container.clear()
                    container.update(content)
                elif isinstance(container, list):
                    container[:] = content
                else:
                    container.clear()
                    container.update(content)
        if changed:
            report.restored.append(f"{self.name}: {', '.join(changed[:4])}")


_PRIMITIVES = (str, int, float, bool, bytes, type(None))
_CACHES = frozenset({"__slotnames__", "__warningregistry__"})


class _All(frozenset):
    """A ``quiet`` set that contains every key."""

    def __contains__(self, key: object) -> bool:
        return True


def _same(a: Any, b: Any) -> bool:
    return a is b or (type(a) is type(b) and type(a) in _PRIMITIVES and a == b)


def _inherited(owner: Any, key: str, value: Any) -> bool:
    """Whether ``value``, newly in a class's dict, is what its bases give it anyway.

    Lookup on the class then finds the same object as before, so nothing
    changed: nnsight's backward tracing, for one, puts ``torch.Tensor.grad``
    back by assigning the descriptor the class inherits, which leaves it in
    ``Tensor``'s own dict. Removing it is still right; reporting it is not.
    """
    if not isinstance(owner, type):
        return False
    for base in owner.__mro__[1:]:
        if key in base.__dict__:
            return base.__dict__[key] is value
    return False


def _namespace(owner: Any) -> Optional[dict]:
    if isinstance(owner, type):
        return dict(owner.__dict__)
    try:
        return object.__getattribute__(owner, "__dict__")
    except AttributeError:
        return None


def _assign(owner: Any, namespace: dict, key: str, value: Any) -> None:
    if isinstance(owner, type):
        type.__setattr__(owner, key, value)
    else:
        namespace[key] = value


def _delete(owner: Any, namespace: dict, key: str) -> None:
    if isinstance(owner, type):
        type.__delattr__(owner, key)
    else:
        namespace.pop(key, None)


def _same_contents(container: Any, content: list) -> bool:
    if isinstance(container, dict):
        if len(container) != len(content):
            return False
        return all(container.get(k, _MISSING) is v for k, v in content)
    if isinstance(container, list):
        return len(container) == len(content) and all(a is b for a, b in zip(container, content))
    return len(container) == len(content) and all(item in container for item in content)


_MISSING = object()


# --- modules refuse assignments from user code ----------------------------------------------


class _GuardedModule(types.ModuleType):
    """A module that refuses attribute writes made directly by user code.

    User code is recognised by its builtins: it runs with the sandbox's guarded
    builtins dict, which no library frame has. Library code (an import binding
    a submodule, a lazy cache) writes as usual.
    """

    _user_builtins: Optional[dict] = None

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


def guard_module_attributes(user_builtins: dict) -> int:
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


# --- process-wide state ----------------------------------------------------------------------


def _process_state() -> dict:
    import torch

    state = {
        "default dtype": torch.get_default_dtype(),
        "grad mode": torch.is_grad_enabled(),
        "torch threads": torch.get_num_threads(),
        "deterministic algorithms": torch.are_deterministic_algorithms_enabled(),
        "matmul precision": torch.get_float32_matmul_precision(),
        "anomaly detection": torch.is_anomaly_enabled(),
        "torch random state": torch.get_rng_state(),
    }
    try:
        import numpy

        state["numpy random state"] = numpy.random.get_state()
    except ImportError:
        pass
    return state


def _restore_process_state(state: dict, report: GuardReport) -> None:
    import torch

    now = _process_state()
    setters = {
        "default dtype": torch.set_default_dtype,
        "grad mode": torch.set_grad_enabled,
        "torch threads": torch.set_num_threads,
        "deterministic algorithms": torch.use_deterministic_algorithms,
        "matmul precision": torch.set_float32_matmul_precision,
        "anomaly detection": torch.autograd.set_detect_anomaly,
    }
    for name, setter in setters.items():
        if now[name] != state[name]:
            setter(state[name])
            report.restored.append(f"torch {name}")
    # Random states are put back silently: every job starts from the same seed
    # state, so one user cannot predict or steer another's sampling.
    torch.set_rng_state(state["torch random state"])
    if "numpy random state" in state:
        import numpy

        numpy.random.set_state(state["numpy random state"])


# --- the guard -------------------------------------------------------------------------------


class ModelGuard:
    """Snapshot a loaded model and its surroundings; undo what each job changes."""

    def __init__(self, model: Any, persistent_objects: dict, *, read_only_weights: bool = True) -> None:
        self.model = model
        self.persistent_objects = persistent_objects
        self.read_only_weights = read_only_weights
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
        self.fingerprints: list = []
        if self.image is None:
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
        self.objects = [_DictSnapshot(m, f"module {n or 'model'}") for n, m in module.named_modules()]
        for key, obj in self.persistent_objects.items():
            if not isinstance(obj, torch.nn.Module):
                # nnsight resets its interleaver's run state on every request:
                # it is put back all the same, but is not worth a word to the user.
                quiet = _All() if key == "Interleaver" else ()
                self.objects.append(_DictSnapshot(obj, key, quiet))
        for name in ("tokenizer", "pipeline", "config"):
            obj = getattr(self.model, name, None) if name != "config" else getattr(module, "config", None)
            if obj is not None and _namespace(obj) is not None:
                if not any(snapshot.owner is obj for snapshot in self.objects):
                    self.objects.append(_DictSnapshot(obj, name))
        try:  # nnsight's own settings object (e.g. CONFIG.APP.DEBUG, CONFIG.API.HOST)
            from nnsight import CONFIG

            for name, value in [("nnsight.CONFIG", CONFIG)] + [
                (f"nnsight.CONFIG.{key}", item) for key, item in vars(CONFIG).items()
            ]:
                if _namespace(value) is not None:
                    self.objects.append(_DictSnapshot(value, name))
        except ImportError:
            pass
        # Plain modules refuse writes from user code as they happen, so only
        # classes and the modules that could not be guarded are compared.
        self.namespaces = [
            _DictSnapshot(owner, label)
            for owner, label in self._library_owners()
            if not isinstance(owner, _GuardedModule)
        ]
        self.state = _process_state()
        self.threads = threading.active_count()
        self.children = _children()

    def _library_owners(self) -> list[tuple[Any, str]]:
        import torch

        owners: dict[int, tuple[Any, str]] = {}

        def add(obj: Any) -> None:
            if obj is None or id(obj) in owners:
                return
            label = obj.__name__ if isinstance(obj, types.ModuleType) else f"{obj.__module__}.{obj.__qualname__}"
            owners[id(obj)] = (obj, label)

        classes = {type(m) for m in self.model._module.modules()} | {torch.Tensor, type(self.model)}
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

    def protected_storages(self) -> frozenset:
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
        _restore_process_state(self.state, report)
        stopped = _stop_children(self.children)
        if stopped:
            report.restored.append(f"stopped {stopped} process(es) the request left running")
        if threading.active_count() > self.threads:
            report.fatal.append("the request left a thread running")
        return report


def _children() -> set:
    children: set = set()
    try:
        for task in os.listdir("/proc/self/task"):
            with open(f"/proc/self/task/{task}/children") as file:
                children.update(int(pid) for pid in file.read().split())
    except OSError:
        pass
    return children


def _stop_children(known: set) -> int:
    """Kill and reap the child processes a job started (its DataLoader workers, say)."""
    import signal

    children = _children() - known
    for pid in children:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    for pid in children:
        try:
            os.waitpid(pid, 0)
        except OSError:
            pass
    return len(children)


def _layout(tensor: Any) -> tuple:
    return (
        tuple(tensor.shape),
        tuple(tensor.stride()),
        tensor.dtype,
        str(tensor.device),
        tensor.storage_offset(),
        bool(tensor.requires_grad),
    )


# --- what a job changed in its own process (fork-per-job: reported, never restored) --------


def shared_state() -> dict:
    """torch's process-wide settings and global hooks, cheaply (tens of microseconds).

    With one process per job nothing needs restoring: this only lets the final
    message tell the user what their request changed in its own process.
    """
    import torch
    from torch.nn.modules import module as torch_module

    state = {key: value for key, value in _process_state().items() if "random" not in key}
    state["default device"] = str(torch.get_default_device())
    state["torch function modes"] = torch._C._len_torch_function_stack()
    for name in ("_global_forward_hooks", "_global_forward_pre_hooks", "_global_backward_hooks",
                 "_global_module_registration_hooks"):
        registry = getattr(torch_module, name, None)
        if registry is not None:
            state[f"global module hooks ({name.strip('_')})"] = len(registry)
    return state


def shared_state_changes(before: dict) -> list[str]:
    after = shared_state()
    return [f"torch {key}" for key, value in before.items() if after.get(key) != value]

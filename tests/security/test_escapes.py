"""Hostile requests through the real nnsight client, each refused with a clear reason.

Every case is a program a stranger could send. Each one states what must come
back (a RemoteError matching a pattern, or, for changes to shared state that
are undone rather than refused, any outcome), and the ``serving`` fixture then
checks that the next normal request gives the same values as the same code run
locally: nothing a case did survives it.
"""

from __future__ import annotations

import re
import socket
import threading
import typing

import nnsight
import numpy
import pytest
import sympy
import torch

from .conftest import SECRET
from .helpers import PROMPT

CASES = []
REFUSED_IMPORT = r"importing '{}' is not allowed on this server\. Modules you may import: builtins, math, typing, collections, time, torch, numpy"
NOT_AVAILABLE = r"'{}' is not available on this server"
CRASHED = r"crashed it, for example by writing into the model's weights, which are read-only"


def case(expect: str, outcome: str = "error"):
    """Register a hostile program; ``expect`` is matched against the error."""

    def register(program):
        CASES.append(pytest.param(program, expect, outcome, id=program.__name__[5:]))
        return program

    return register


# --- imports ------------------------------------------------------------------------


@case(REFUSED_IMPORT.format("os"))
def case_import_os(model, url):
    with model.trace(PROMPT, remote=url):
        import os

        out = nnsight.save(os.getcwd())


@case(REFUSED_IMPORT.format("sys"))
def case_import_sys(model, url):
    with model.trace(PROMPT, remote=url):
        import sys

        out = nnsight.save(sys.modules["os"].environ["NNHOST_TEST_SECRET"])


@case(REFUSED_IMPORT.format("subprocess"))
def case_import_subprocess(model, url):
    with model.trace(PROMPT, remote=url):
        import subprocess

        out = nnsight.save(subprocess.run(["id"], capture_output=True).stdout)


@case(REFUSED_IMPORT.format("socket"))
def case_import_socket(model, url):
    with model.trace(PROMPT, remote=url):
        import socket

        out = nnsight.save(socket.gethostname())


@case(REFUSED_IMPORT.format("ctypes"))
def case_import_ctypes(model, url):
    with model.trace(PROMPT, remote=url):
        import ctypes

        ctypes.memset(0, 0, 1)


@case(REFUSED_IMPORT.format("importlib"))
def case_import_importlib(model, url):
    with model.trace(PROMPT, remote=url):
        import importlib

        out = nnsight.save(importlib.import_module("os").getcwd())


@case(REFUSED_IMPORT.format("pathlib"))
def case_import_pathlib(model, url):
    with model.trace(PROMPT, remote=url):
        import pathlib

        out = nnsight.save(pathlib.Path("/etc/passwd").read_text())


@case(REFUSED_IMPORT.format("shutil"))
def case_import_shutil(model, url):
    with model.trace(PROMPT, remote=url):
        import shutil

        shutil.rmtree("/tmp")


@case(REFUSED_IMPORT.format("pickle"))
def case_import_pickle(model, url):
    with model.trace(PROMPT, remote=url):
        import pickle

        out = nnsight.save(pickle.loads(b"cos\nsystem\n(S'id'\ntR."))


@case(REFUSED_IMPORT.format("os"))
def case_from_os_import_system(model, url):
    with model.trace(PROMPT, remote=url):
        from os import system

        system("id")


@case(r"importing 'torch\.hub' is not allowed on this server: 'hub' is a private or refused part")
def case_import_refused_submodule(model, url):
    with model.trace(PROMPT, remote=url):
        import torch.hub

        torch.hub.load("evil/repo", "model")


@case(r"AttributeRefused: the attribute 'os' is not available on this server")
def case_dynamic_getattr_of_a_module(model, url):
    with model.trace(PROMPT, remote=url):
        os_module = getattr(torch, "o" + "s")
        out = nnsight.save(os_module.getcwd())


@case(NOT_AVAILABLE.format("__import__"))
def case_dunder_import(model, url):
    with model.trace(PROMPT, remote=url):
        out = nnsight.save(__import__("os").getcwd())


def _helper_that_imports():
    import subprocess

    return subprocess.run(["id"], capture_output=True).stdout


@case(r"subprocess")
def case_import_inside_a_shipped_function(model, url):
    with model.trace(PROMPT, remote=url):
        out = nnsight.save(_helper_that_imports())


def _helper_with_a_computed_dunder(value):
    return getattr(value, "__cla" + "ss__")


@case(r"AttributeRefused: the attribute '__class__' is not available")
def case_computed_dunder_inside_a_shipped_function(model, url):
    with model.trace(PROMPT, remote=url):
        out = nnsight.save(_helper_with_a_computed_dunder(()))


@case(REFUSED_IMPORT.format("subprocess"))
def case_registered_module_imports_subprocess(model, url, tmp_path=None):
    import importlib
    import sys
    import tempfile

    folder = tempfile.mkdtemp()
    with open(f"{folder}/nnhost_evil_helpers.py", "w") as file:
        file.write(
            "import subprocess\n\n"
            "def whoami():\n"
            "    return subprocess.run(['id'], capture_output=True).stdout\n"
        )
    sys.path.insert(0, folder)
    try:
        helpers = importlib.import_module("nnhost_evil_helpers")
    finally:
        sys.path.remove(folder)
    nnsight.register(helpers)
    with model.trace(PROMPT, remote=url):
        out = nnsight.save(helpers.whoami())


# --- walking the object graph -------------------------------------------------------------


@case(r"the attribute '__class__' is not available on this server \(introspection is refused\)")
def case_subclasses_walk(model, url):
    with model.trace(PROMPT, remote=url):
        classes = ().__class__.__base__.__subclasses__()
        wrap = [c for c in classes if c.__name__ == "_wrap_close"][0]
        wrap.__init__.__globals__["system"]("id")


@case(r"the attribute '__globals__' is not available")
def case_globals_walk(model, url):
    with model.trace(PROMPT, remote=url):
        out = nnsight.save(torch.nn.functional.relu.__globals__["torch"].os.environ)


@case(r"the attribute '__self__' is not available")
def case_builtin_self_walk(model, url):
    with model.trace(PROMPT, remote=url):
        out = nnsight.save(print.__self__.open("/etc/passwd").read())


@case(r"the attribute 'gi_frame' is not available")
def case_generator_frame_walk(model, url):
    with model.trace(PROMPT, remote=url):
        generator = (i for i in [1])
        out = nnsight.save(generator.gi_frame.f_back.f_globals)


@case(r"the attribute '__traceback__' is not available")
def case_traceback_frame_walk(model, url):
    with model.trace(PROMPT, remote=url):
        out = None
        try:
            1 / 0
        except ZeroDivisionError as error:
            out = nnsight.save(error.__traceback__.tb_frame.f_globals)


@case(r"the attribute 'mro' is not available")
def case_mro_walk(model, url):
    with model.trace(PROMPT, remote=url):
        out = nnsight.save(type(model).mro()[-1])


@case(NOT_AVAILABLE.format("vars"))
def case_vars_of_a_module(model, url):
    with model.trace(PROMPT, remote=url):
        out = nnsight.save(vars(torch)["os"].environ)


@case(r"the attribute 'os' is not available")
def case_torch_os(model, url):
    with model.trace(PROMPT, remote=url):
        torch.os.system("id")


@case(r"the attribute 'os' is not available")
def case_numpy_os_environ(model, url):
    with model.trace(PROMPT, remote=url):
        out = nnsight.save(numpy.os.environ["NNHOST_TEST_SECRET"])


@case(r"AttributeRefused: the attribute '__dict__' is not available")
def case_getattr_with_a_computed_dunder(model, url):
    with model.trace(PROMPT, remote=url):
        name = "_" * 2 + "dict" + "_" * 2
        out = nnsight.save(getattr(torch, name)["os"])


@case(r"the attribute 'code' is not available")
def case_rewrite_a_blocks_code_object(model, url):
    with model.trace(remote=url) as tracer:
        with tracer.invoke(PROMPT) as invoker:
            body = invoker.info.code.replace(co_names=("__class__", "__base__"))
            out = model.lm_head.output.save()


@case(r"the attribute 'globals' is not available")
def case_plant_source_in_nnsights_cache(model, url):
    with model.trace(PROMPT, remote=url):
        nnsight.tracing.globals.SOURCES.clear()
        out = model.lm_head.output.save()


# --- builtins -----------------------------------------------------------------------------


@case(r"'__builtins__' is not available|refers to builtins\.")
def case_builtins_dict(model, url):
    with model.trace(PROMPT, remote=url):
        __builtins__["__import__"]("os").system("id")


@case(r"the attribute 'open' is not available")
def case_builtins_module_open(model, url):
    with model.trace(PROMPT, remote=url):
        import builtins

        out = nnsight.save(builtins.open("/etc/passwd").read())


@case("", outcome="any")
def case_builtins_module_tampering(model, url):
    with model.trace(PROMPT, remote=url):
        import builtins

        builtins.len = lambda value: 0
        builtins.print = None


@case(r"modules are read-only in a request: cannot set torch\.nn\.functional\.gelu")
def case_patching_a_library_function(model, url):
    with model.trace(PROMPT, remote=url):
        torch.nn.functional.gelu = lambda x, approximate="none": x * 0


@case("", outcome="any")
def case_patching_a_library_class(model, url):
    with model.trace(PROMPT, remote=url):
        torch.nn.Linear.forward = lambda self, x: x * 0
        torch.Tensor.softmax = lambda self, *args, **kwargs: self * 0
        out = model.lm_head.output.save()


# --- strings that become code -----------------------------------------------------------------


@case(NOT_AVAILABLE.format("eval"))
def case_eval(model, url):
    with model.trace(PROMPT, remote=url):
        out = nnsight.save(eval("__import__('os').getcwd()"))


@case(NOT_AVAILABLE.format("exec"))
def case_exec(model, url):
    with model.trace(PROMPT, remote=url):
        exec("import os; os.system('id')")


@case(NOT_AVAILABLE.format("compile"))
def case_compile(model, url):
    with model.trace(PROMPT, remote=url):
        code = compile("import os", "<x>", "exec")


@case(r"Operation not permitted|is not available on this server|is not allowed on this server")
def case_sympy_starts_python_with_code_from_the_request(model, url):
    with model.trace(PROMPT, remote=url):
        from sympy.testing import runtests

        code = nnsight.save(runtests.run_in_subprocess_with_hash_randomization(
            "getcwd", module="os", force=True))


@case(r"sympy expression>.*'__import__' is not available")
def case_sympy_string_evaluation(model, url):
    with model.trace(PROMPT, remote=url):
        out = nnsight.save(str(sympy.sympify("__import__('os').getcwd()")))


@case(r"type annotation>.*'__import__' is not available")
def case_typing_forward_reference(model, url):
    with model.trace(PROMPT, remote=url):
        reference = typing.ForwardRef("__import__('os').getcwd()")
        out = nnsight.save(reference._evaluate(None, None, frozenset()))


# --- files ------------------------------------------------------------------------------------


@case(NOT_AVAILABLE.format("open"))
def case_read_etc_passwd(model, url):
    with model.trace(PROMPT, remote=url):
        out = nnsight.save(open("/etc/passwd").read())


@case(r"the attribute 'fromfile' is not available")
def case_read_the_database_with_numpy(model, url, data_dir="/"):
    with model.trace(PROMPT, remote=url):
        out = nnsight.save(numpy.fromfile(data_dir + "/nnhost.sqlite3", dtype=numpy.uint8))


@case(r"the attribute 'load' is not available")
def case_read_another_users_result(model, url, data_dir="/"):
    with model.trace(PROMPT, remote=url):
        out = nnsight.save(torch.load(data_dir + "/results/0123.result"))


@case(r"Read-only file system")
def case_write_outside_the_scratch_space(model, url):
    with model.trace(PROMPT, remote=url):
        torch.save(torch.ones(3), "/work/planted.pt")


@case(r"No such file or directory|does not exist")
def case_write_into_the_data_directory(model, url, data_dir="/"):
    with model.trace(PROMPT, remote=url):
        torch.save(torch.ones(3), data_dir + "/results/planted.result")


@case(NOT_AVAILABLE.format("open"))
def case_read_own_environment(model, url):
    with model.trace(PROMPT, remote=url):
        out = nnsight.save(open("/proc/self/environ").read())


# --- resources ---------------------------------------------------------------------------------


@case(r"ran out of the memory this server allows one request")
def case_memory_bomb_one_allocation(model, url):
    with model.trace(PROMPT, remote=url):
        big = torch.ones(2**30)  # 4 GiB
        out = big.sum().save()


# Many allocations, none over the limit alone: `test_isolation.TestMemoryByManyAllocations`
# (a server with a smaller budget, reached before its time limit on a slow machine).


@case(r"daemonic processes are not allowed to have children|Resource temporarily unavailable")
def case_fork_bomb_through_a_dataloader(model, url):
    with model.trace(PROMPT, remote=url):
        loader = torch.utils.data.DataLoader(list(range(512)), num_workers=128)
        out = nnsight.save(sum(int(batch.sum()) for batch in loader))


@case(r"time limit of 5 seconds")
def case_infinite_loop(model, url):
    with model.trace(PROMPT, remote=url):
        while True:
            pass


@case(r"did not stop when interrupted, so its worker process was killed")
def case_infinite_loop_that_swallows_the_interrupt(model, url):
    with model.trace(PROMPT, remote=url):
        while True:
            try:
                while True:
                    pass
            except BaseException:
                pass


@case(r"RecursionError")
def case_unbounded_recursion(model, url):
    with model.trace(PROMPT, remote=url):
        def deeper(n):
            return deeper(n + 1)

        deeper(0)


@case(r"SystemExit")
def case_system_exit(model, url):
    with model.trace(PROMPT, remote=url):
        raise SystemExit(0)


@case(r"over this server's limit of 2,097,152 bytes\. Save less")
def case_giant_result(model, url):
    with model.trace(PROMPT, remote=url):
        big = torch.randn(2_000_000).save()  # 8 MB, and zstd cannot shrink it


@case(r"could not be sent back: steps \(generator\) cannot be serialized")
def case_result_that_cannot_be_serialized(model, url):
    with model.trace(PROMPT, remote=url):
        steps = nnsight.save((i for i in range(3)))


@case(r"could not be sent back: .*function")
def case_result_that_is_a_function(model, url):
    with model.trace(PROMPT, remote=url):
        function = nnsight.save(lambda: 1)


# --- the shared model ---------------------------------------------------------------------------


@case(CRASHED)
def case_write_into_a_weight(model, url):
    with model.trace(PROMPT, remote=url):
        model.transformer.h[0].mlp.c_fc.weight[:] = 0


@case(CRASHED)
def case_zero_a_weight_through_data(model, url):
    with model.trace(PROMPT, remote=url):
        model.lm_head.weight.data.zero_()


@case(CRASHED)
def case_add_to_a_weight_in_place(model, url):
    with model.trace(PROMPT, remote=url):
        model.transformer.h[1].mlp.c_proj.weight.add_(1.0)


@case("", outcome="any")
def case_replace_a_weight(model, url):
    with model.trace(PROMPT, remote=url):
        weight = model.transformer.h[0].attn.c_attn.weight
        weight.data = torch.zeros_like(weight)
        model.transformer.h[0].mlp.c_fc.weight = torch.nn.Parameter(torch.zeros(64, 256))
        out = model.lm_head.output.save()


@case("", outcome="any")
def case_leave_a_hook_on_the_model(model, url):
    with model.trace(PROMPT, remote=url):
        model._module.transformer.h[0].mlp.register_forward_hook(lambda m, i, o: o * 0)
        out = model.lm_head.output.save()


@case("", outcome="any")
def case_change_torch_defaults(model, url):
    with model.trace(PROMPT, remote=url):
        torch.set_default_dtype(torch.float64)
        torch.manual_seed(1234)
        out = model.lm_head.output.save()


@pytest.mark.parametrize("program, expect, outcome", CASES)
def test_hostile_request(program, expect, outcome, serving, remote_model, monkeypatch):
    """The case gets its refusal, and the server then answers a normal request correctly."""
    from nnsight.intervention.backends.remote import RemoteError

    data_dir = str(serving.data_dir)
    kwargs = {"data_dir": data_dir} if "data_dir" in program.__code__.co_varnames else {}
    if outcome == "any":
        try:
            program(remote_model, serving.url, **kwargs)
        except RemoteError:
            pass
        return
    with pytest.raises(RemoteError) as caught:
        program(remote_model, serving.url, **kwargs)
    message = str(caught.value)
    assert re.search(expect, message, re.S), message
    assert SECRET not in message


def test_the_cases_cover_the_issue():
    assert len(CASES) >= 40


def test_no_connection_reaches_a_loopback_listener(serving, remote_model):
    """A request that opens a connection (through allowed code) never reaches the host."""
    from nnsight.intervention.backends.remote import RemoteError

    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    listener.settimeout(0.2)
    port = listener.getsockname()[1]
    accepted = []
    stop = threading.Event()

    def accept():
        while not stop.is_set():
            try:
                connection, _ = listener.accept()
                accepted.append(connection)
            except OSError:
                pass

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        with pytest.raises(RemoteError, match="Network is unreachable"):
            with remote_model.trace(PROMPT, remote=serving.url):
                nnsight.CONFIG.API.HOST = f"http://127.0.0.1:{port}"
                reply = nnsight.save(nnsight.ndif._get("/status", timeout=(2.0, 2.0)))
    finally:
        stop.set()
        thread.join(timeout=2)
        listener.close()
    assert accepted == [], "the worker reached a listener on the host's loopback"


def test_restored_changes_are_reported_to_the_user(serving, remote_model):
    """A change to process-wide state says so in the job's description, and that it went nowhere."""
    import asyncio

    from nnsight.intervention.backends.remote import AsyncRemoteBackend

    backend = AsyncRemoteBackend(remote_model.to_model_key(), host=serving.url)
    with remote_model.trace(PROMPT, backend=backend):
        torch.set_default_dtype(torch.float64)
        out = remote_model.lm_head.output.save()

    async def consume():
        return [update async for update in backend]

    updates = asyncio.run(consume())
    completed = updates[-2]
    assert completed.status.value == "COMPLETED"
    assert "no other user's request sees the change" in completed.description
    assert "default dtype" in completed.description
    # The same user's next request, which may run in the same process, starts without it.
    from nnsight.intervention.backends.remote import RemoteBackend

    with remote_model.trace(PROMPT, backend=RemoteBackend(remote_model.to_model_key(), host=serving.url)):
        fresh = torch.zeros(1).save()
    assert fresh.dtype == torch.float32, out


def test_legitimate_edits_still_work(serving, remote_model, local_model):
    """nnsight's edits compile their source on the server: checked, and still working."""
    from compare import assert_same

    def program(model, remote):
        with model.edit() as (tracer, edited):
            edited.transformer.h[0].output[:] = 0
        with edited.trace(PROMPT, remote=remote):
            hidden = edited.transformer.h[0].output.save()
            logits = edited.lm_head.output.save()
        return {"hidden": hidden, "logits": logits}

    remote = program(remote_model, serving.url)
    assert_same(remote, program(local_model, False))
    assert torch.all(remote["hidden"] == 0)

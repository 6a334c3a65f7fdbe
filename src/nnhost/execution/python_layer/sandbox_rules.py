"""The sandbox's rules as data: what user code may import, name and define.

`sandbox` applies these tables (in `check_source`, the guarded builtins and
`SandboxPolicy`), `unpickling` applies them to what a payload names, and the
operator's ``allowed_imports`` replaces only `DEFAULT_ALLOWED_IMPORTS`. Kept
apart from the logic so that what is allowed is read, and reviewed, in one place.

Nothing here is checked or imported by being listed; but every entry is a door
(or a wall) for every request, so an entry must never be added to an allowing
table, or removed from a denying one, without the scrutiny a change to the
checks themselves gets.
"""

from __future__ import annotations

#: What user code may import unless the operator says otherwise.
DEFAULT_ALLOWED_IMPORTS: tuple[str, ...] = (
    "builtins",
    "math",
    "typing",
    "collections",
    "time",
    "torch",
    "numpy",
    "einops",
    "sympy",
    "nnterp",
    # How a user's script declares its data (dataclasses, enums): their
    # generated code is made from checked field names (`library_hardening`).
    "dataclasses",
    "enum",
)

#: Always importable: every request payload refers to nnsight's own objects.
PROTOCOL_MODULES: tuple[str, ...] = ("nnsight",)

#: Protocol methods a user may name: using them reveals nothing about the process.
SAFE_DUNDERS = frozenset(
    f"__{name}__"
    for name in (
        "init call len getitem setitem delitem contains iter next reversed enter exit "
        "repr str format name qualname doc hash bool eq ne lt le gt ge "
        "add sub mul truediv floordiv mod pow matmul and or xor lshift rshift divmod "
        "radd rsub rmul rtruediv rfloordiv rmod rpow rmatmul rand ror rxor rlshift rrshift "
        "iadd isub imul itruediv ifloordiv imod ipow imatmul iand ior ixor ilshift irshift "
        "neg pos abs invert int float complex index round trunc floor ceil "
        "array torch_function post_init"
    ).split()
)

#: Attribute names refused wherever they appear: introspection that leads out of
#: the sandbox, modules an allowed library happens to hold (``torch.os``), and
#: functions that read or write files, unpickle, evaluate strings or reach memory.
DENIED_ATTRIBUTES = frozenset(
    (
        # frames, code and the class graph
        "tb_frame tb_next f_globals f_locals f_builtins f_back f_code f_trace "
        "gi_frame gi_code cr_frame cr_code ag_frame ag_code co_code mro "
        "func_globals func_code im_func im_self code globals SOURCES BLOCKS "
        # modules that an allowed package holds as an attribute
        "os sys subprocess builtins importlib ctypes _ctypes socket shutil pathlib "
        "pickle cloudpickle dill marshal gc inspect threading _thread multiprocessing "
        "signal posix nt resource mmap pty fcntl tempfile glob code codeop runpy "
        "platform sysconfig site io types weakref linecache traceback asyncio "
        "concurrent http urllib requests httpx ssl select selectors zipimport pkgutil "
        "webbrowser atexit faulthandler tracemalloc serialization ctypeslib "
        # files, pickles, native code, string evaluation, raw memory
        "load loads from_file fromfile tofile memmap load_library read_array "
        "npyio lib hub jit package cpp_extension _C _dynamo _inductor compile "
        "deserialize lambdify parse_expr eval exec system popen spawnv execv fork "
        "as_strided save_pretrained push_to_hub open loadtxt genfromtxt savetxt savez "
        "savez_compressed fromregex DataSource read_text read_bytes write_text write_bytes "
        "collect_env f2py distutils hipify _internal "
        # a library's own ways to start a program (sympy's test runner runs `python -c`)
        "runtests run_in_subprocess_with_hash_randomization"
    ).split()
)

#: Builtins user code does not get (each is a way out, or a way to the disk).
REMOVED_BUILTINS = frozenset(
    "eval exec compile open input breakpoint help exit quit copyright credits license "
    "globals locals vars memoryview __loader__ __spec__".split()
)

#: Names a block may not mention at all.
DENIED_NAMES = REMOVED_BUILTINS | {"__import__", "__builtins__"}

#: Dunder names a block may mention: the parameters nnsight 0.6 and 0.7 give the
#: functions they compile a block into (its tracer or mediator, their info, an
#: iteration without a name), read as locals.
PROTOCOL_NAMES = frozenset({
    "__nnsight_tracer__", "__nnsight_mediator__", "__nnsight_tracing_info__", "__nnsight_iteration__",
})

#: Methods a user's class may not define.
DENIED_METHODS = frozenset({"__del__", "__init_subclass__", "__set_name__", "__class_getitem__"})

#: Submodules allowed packages import lazily on first use of a function; loaded
#: when a worker starts so that first use in a fresh process costs no import.
LAZY_SUBMODULES: tuple[str, ...] = (
    "numpy._core._methods",
    "numpy._core._internal",
    "numpy._core._exceptions",
    "numpy._core._dtype",
    "numpy._core.arrayprint",
    "numpy.linalg",
    "numpy.fft",
    "numpy.random",
    "numpy.lib._function_base_impl",
    "numpy.lib._nanfunctions_impl",
    "torch._tensor_str",
    "torch.distributions",
    "torch.linalg",
    "torch.fft",
    "torch.special",
    "einops",
    "einops._backends",
    "sympy",
)

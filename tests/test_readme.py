"""The README's promises, checked: its Python examples run as written.

Every ```python block of README.md is written, in order, to one real .py file
and run in a fresh interpreter against a server started the way the README
says (``nnhost serve --demo``, which builds the demo model into an empty cache
here). A file rather than ``exec`` because nnsight reads the source of each
traced ``with`` block through the code object's filename; a subprocess so the
client's environment (``NDIF_HOST``, ``HF_ENDPOINT``, an empty ``HF_HOME``) is
read fresh at import, exactly as on a user's machine.

This module's server is its own; it does not use conftest's session server,
which serves a different model.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from nnhost.testing import ServerProcess, free_port

README = Path(__file__).resolve().parent.parent / "README.md"
DOCS = README.parent / "docs"
#: The pages the README's operator reference moved to: the flags they name are checked
#: as the README's are (docs/deploying.md has its own, stricter checks below).
REFERENCE_PAGES = ("configuration", "models", "gpus", "accounts", "jobs-and-results",
                   "observability", "security", "development", "benchmarks")
API_KEY = "nnh_readme_" + "r" * 40
DEMO_REPO = "nnhost/demo-gpt2"

_FENCE = re.compile(r"^```([\w-]*)[^\n]*\n(.*?)^```[ \t]*$", re.MULTILINE | re.DOTALL)


def readme_text() -> str:
    return README.read_text(encoding="utf-8")


def code_blocks(text: str, language: str) -> list[str]:
    return [body for lang, body in _FENCE.findall(text) if lang == language]


def section(text: str, title: str, page: str = "README.md") -> str:
    """The body of the ``## title`` section, up to the next ``## `` heading."""
    match = re.search(
        rf"^## {re.escape(title)}[ \t]*\n(.*?)(?=^## |\Z)", text, re.MULTILINE | re.DOTALL
    )
    assert match, f"{page} has no '## {title}' section"
    return match.group(1)


# --- the text alone ------------------------------------------------------------


def test_quick_start_is_two_commands():
    blocks = code_blocks(section(readme_text(), "Quick start"), "sh")
    assert [block.strip() for block in blocks] == ["make serve", "make test"]


def _script_parser(name: str):
    """The README's other command lines: ``make bench ARGS=...``, the breakdown and the GPU check."""
    import importlib.util

    path = README.parent / "benchmarks" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"nnhost_bench_{name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.build_parser()


def _known_flags() -> set[str]:
    """The flags of nnhost's commands and of the benchmark scripts the README runs."""
    import argparse

    from nnhost.cli import build_parser

    known: set[str] = set()
    pending = [build_parser(), _script_parser("suite"), _script_parser("gpu_check"), _script_parser("breakdown")]
    while pending:
        parser = pending.pop()
        for action in parser._actions:
            known.update(action.option_strings)
            if isinstance(action, argparse._SubParsersAction):
                pending.extend(action.choices.values())
    return known


def _declared_flags(path: Path) -> set[str]:
    """The flags a script declares with ``add_argument`` (read, not run: its imports are not ours)."""
    import ast

    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "add_argument":
            found.update(arg.value for arg in node.args
                         if isinstance(arg, ast.Constant) and str(arg.value).startswith("--"))
    return found


def _flags_named(text: str) -> set[str]:
    # Ray's own command lines (`ray start ...`) name Ray's flags, not ours.
    ours = "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("ray "))
    return set(re.findall(r"(?<![\w-])--[a-z][a-z-]*", ours))


def test_every_flag_named_exists_in_the_cli():
    known = _known_flags()
    named = _flags_named(readme_text())
    assert named, "expected the README to name some flags"
    assert named <= known, f"flags in README.md that nnhost does not have: {named - known}"


@pytest.mark.parametrize("name", REFERENCE_PAGES)
def test_every_flag_the_reference_names_exists(name):
    """The operator reference in docs/ is held to the README's rule; it also names the
    other benchmark scripts' flags and `nnhost runtimes`', read from their add_argument calls."""
    known = _known_flags() | _declared_flags(README.parent / "src" / "nnhost" / "runtimes.py")
    for script in sorted((README.parent / "benchmarks").glob("*.py")):
        known |= _declared_flags(script)
    named = _flags_named((DOCS / f"{name}.md").read_text(encoding="utf-8"))
    assert named <= known, f"flags in docs/{name}.md that nnhost does not have: {named - known}"


def test_every_setting_is_documented():
    """The settings table moved to docs/configuration.md (rendered from the settings:
    tests/test_settings_docs.py); the README links there."""
    from nnhost.config import Settings

    text = (DOCS / "configuration.md").read_text(encoding="utf-8")
    configuration = section(text, "Every setting", "docs/configuration.md")
    missing = [name for name in Settings.model_fields if f"`{name}`" not in configuration]
    assert not missing, f"settings missing from docs/configuration.md's table: {missing}"
    assert "(docs/configuration.md)" in readme_text()


# --- docs/deploying.md: every nnhost command, flag and setting it names -------------

GUIDE = README.parent / "docs" / "deploying.md"
#: Tokens a command line may start with before the command itself.
_PREFIXES = {"sudo", "env", "exec"}
#: A command line's separators: each part is one command.
_SEPARATORS = re.compile(r"&&|\|\||[;|]")
_SPAN = re.compile(r"`([^`\n]+)`")


def guide_text() -> str:
    return GUIDE.read_text(encoding="utf-8")


def _all_parsers():
    import argparse

    from nnhost.cli import build_parser

    root = build_parser()
    found, pending = [], [root]
    while pending:
        parser = pending.pop()
        found.append(parser)
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                pending.extend(action.choices.values())
    return root, found


def _shell_commands(block: str) -> list[list[str]]:
    """Each command of a shell block, as tokens, continuation lines joined, comments dropped."""
    import shlex

    commands = []
    for line in block.replace("\\\n", " ").splitlines():
        for part in _SEPARATORS.split(line):
            try:
                tokens = shlex.split(part, comments=True)
            except ValueError:
                tokens = part.split()
            if tokens:
                commands.append(tokens)
    return commands


def _nnhost_problems(tokens: list[str], root) -> list[str]:
    """Why ``tokens`` is not a command line nnhost accepts (flags checked per subcommand);
    [] when it is, or when it is not an nnhost command at all."""
    import argparse

    while tokens and (tokens[0] in _PREFIXES or re.fullmatch(r"[A-Z_][A-Z0-9_]*=.*", tokens[0])):
        tokens = tokens[1:]
    if not tokens or tokens[0] != "nnhost":
        return []
    line, parser, words, problems = " ".join(tokens), root, ["nnhost"], []
    rest = iter(tokens[1:])
    for token in rest:
        if token.startswith("-"):
            name = token.split("=", 1)[0]
            action = parser._option_string_actions.get(name)
            if action is None:
                problems.append(f"{' '.join(words)} has no {name} (in `{line}`)")
            elif action.nargs != 0 and "=" not in token:
                next(rest, None)  # its value
            continue
        commands = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        if commands:
            if token not in commands[0].choices:
                problems.append(f"{' '.join(words)} has no command {token!r} (in `{line}`)")
                return problems
            parser = commands[0].choices[token]
            words.append(token)
    return problems


def test_deploying_guide_is_linked_from_the_readme():
    assert "(docs/deploying.md)" in section(readme_text(), "Where to go next")


def test_deploying_guide_nnhost_commands_exist():
    root, _ = _all_parsers()
    text = guide_text()
    lines = [tokens for block in code_blocks(text, "sh") for tokens in _shell_commands(block)]
    lines += [_shell_commands(span)[0] for span in _SPAN.findall(text) if span.startswith("nnhost ")]
    checked = [tokens for tokens in lines if "nnhost" in tokens[:3]]
    assert any(tokens[1:3] == ["serve", "--role"] for tokens in checked), "expected nnhost serve --role ..."
    problems = [problem for tokens in lines for problem in _nnhost_problems(tokens, root)]
    assert not problems, "docs/deploying.md names what nnhost does not have:\n" + "\n".join(problems)


def test_deploying_guide_flags_in_prose_exist():
    """A flag named in the text (outside code blocks and other tools' command lines) is nnhost's."""
    _, parsers = _all_parsers()
    known = {option for parser in parsers for action in parser._actions
             for option in action.option_strings}
    prose = _FENCE.sub("", guide_text())
    # `ray start --head`, `pip install --index-url`: other tools' flags, not ours.
    prose = _SPAN.sub(
        lambda span: span.group(0) if span.group(1).startswith(("--", "nnhost ")) else "", prose
    )
    named = set(re.findall(r"(?<![\w-])--[a-z][a-z-]*", prose))
    assert "--role" in named and "--results-endpoint" in named
    assert named <= known, f"flags in docs/deploying.md that nnhost does not have: {named - known}"


def test_deploying_guide_settings_are_accepted(tmp_path, monkeypatch):
    """Each nnhost.toml of the guide loads as the server would load it: known keys, valid values."""
    from nnhost.config import load_settings

    for name in [name for name in os.environ if name.upper().startswith("NNHOST_")]:
        monkeypatch.delenv(name)
    blocks = code_blocks(guide_text(), "toml")
    assert blocks, "expected the guide's nnhost.toml"
    for index, block in enumerate(blocks):
        path = tmp_path / f"nnhost-{index}.toml"
        path.write_text(block, encoding="utf-8")
        settings = load_settings({"data_dir": str(tmp_path / "data")}, path)
        assert settings.catalog or settings.allow, "expected the guide's [[model]] or [[allow]] table"


# --- the examples, against a real server ---------------------------------------


@pytest.fixture(scope="module")
def demo_server(tmp_path_factory):
    root = tmp_path_factory.mktemp("readme-server")
    process = ServerProcess(
        ["--demo"],  # as `make serve` does; trains the demo model into the empty cache
        data_dir=root / "data",
        hf_home=root / "hf",
        api_key=API_KEY,
        port=free_port(),
    )
    try:
        # The first start trains the demo model (~15 s on two cores) before serving.
        process.start(timeout=600)
        yield process
    finally:
        process.stop()


def test_serve_prints_the_lines_to_paste(demo_server):
    log = demo_server.log_path.read_text(errors="replace")
    assert f"export NDIF_HOST={demo_server.url}\n" in log
    assert f"export NDIF_API_KEY={API_KEY}\n" in log
    assert f"export HF_ENDPOINT={demo_server.url}/hub\n" in log
    assert DEMO_REPO in demo_server.status()["deployments"]


def test_python_examples_run_as_written(demo_server, tmp_path):
    blocks = code_blocks(readme_text(), "python")
    assert len(blocks) >= 7, f"expected the walkthrough's examples, found {len(blocks)} blocks"
    assert 'LanguageModel("nnhost/demo-gpt2")' in blocks[0]

    script = tmp_path / "readme_examples.py"
    script.write_text("\n\n".join(blocks), encoding="utf-8")
    client_hf = tmp_path / "client-hf"
    client_hf.mkdir()

    # conftest.py points these at its own server in os.environ; the user's
    # shell, as the README describes it, points them at this one.
    env = {key: value for key, value in os.environ.items() if not key.startswith("NNHOST_")}
    env.pop("HF_HUB_OFFLINE", None)
    env.update(
        NDIF_HOST=demo_server.url,
        NDIF_API_KEY=API_KEY,
        HF_ENDPOINT=f"{demo_server.url}/hub",
        HF_HOME=str(client_hf),
        NNSIGHT_CONFIG=str(tmp_path / "nnsight-config.yaml"),
        NO_COLOR="1",
        TOKENIZERS_PARALLELISM="false",
    )
    completed = subprocess.run(
        [sys.executable, str(script)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    stdout = completed.stdout
    report = (
        f"--- stdout ---\n{stdout[-6000:]}\n--- stderr ---\n{completed.stderr[-6000:]}\n"
        f"--- server log ({demo_server.log_path}) ---\n{demo_server.log_tail(60)}"
    )
    assert completed.returncode == 0, report

    # The status display redraws its line with "\r\x1b[K"; splitlines() breaks
    # at "\r" too, so each redraw becomes a line of its own.
    lines = [line.replace("\x1b[K", "") for line in stdout.splitlines()]

    def printed(expected: str) -> None:
        assert expected in lines, f"{expected!r} was not printed\n{report}"

    printed("Eiffel Tower -> ' Paris'")  # the trace
    printed("The Eiffel Tower is in the city of Paris.<|endoftext|>")  # generate
    printed("[' Rome', '.', '<|endoftext|>']")  # tracer.iter
    printed("Colosseum, patched -> ' Paris'")  # the session's patch
    printed("Colosseum -> ' Rome'")  # non-blocking
    assert any(line.startswith("gradient norm per token: tensor(") for line in lines), report

    # print() inside the trace came back as a LOG line.
    log_lines = [line for line in lines if " LOG " in line]
    assert any(
        line.endswith("last hidden state shape: torch.Size([1, 8, 64])") for line in log_lines
    ), report

    # nnsight.status(), is_model_running() and compare().
    status_rows = [line for line in lines if DEMO_REPO in line and "RUNNING" in line]
    assert status_rows, report
    printed("running: True")
    printed("same Python: True")
    printed("critical mismatches: {}")

"""docs/configuration.md's tables are the settings' own declarations, rendered.

Each setting is declared once, in `nnhost.config.Settings` (and each key of a
``[[model]]`` or ``[[allow]]`` table in `ModelEntry` and `AllowEntry`);
`nnhost.cli.settings_docs` renders them as Markdown, and the page holds that
render between HTML comment markers. A setting added, removed or changed
without ``make docs`` fails here, with the command that brings the page up to
date.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from nnhost.cli import settings_docs
from nnhost.cli.settings_docs import REGENERATE, TABLES, held, markers, render, update
from nnhost.config import Settings

CONFIGURATION = Path(__file__).resolve().parent.parent / "docs" / "configuration.md"


def page() -> str:
    return CONFIGURATION.read_text(encoding="utf-8")


@pytest.mark.parametrize("name", list(TABLES))
def test_the_page_holds_the_current_render(name):
    start, end = markers(name)
    table = held(page(), name)
    assert table is not None, f"docs/configuration.md has no {start} ... {end}; add the two markers"
    assert table == render(TABLES[name]), (
        f"docs/configuration.md's {name} differs from the declarations in src/nnhost/config.py. "
        f"Regenerate it with `{REGENERATE}` (which runs "
        f"`.venv/bin/nnhost settings --write docs/configuration.md`)."
    )


def test_every_setting_has_a_row_with_its_flag_variable_and_description():
    rows = {line.split("|")[1].strip(): line for line in render(Settings).splitlines()[2:]}
    assert set(rows) == {f"`{name}`" for name in Settings.model_fields}
    assert "`--time-limit`" in rows["`time_limit`"] and "`NNHOST_TIME_LIMIT`" in rows["`time_limit`"]
    assert "| `1 h` |" in rows["`time_limit`"] and "| duration |" in rows["`time_limit`"]
    assert "| `256 MiB` |" in rows["`max_request_bytes`"] and "| size |" in rows["`max_request_bytes`"]
    assert "| `DATA_DIR/results` |" in rows["`results`"]  # a `Shown` default
    assert "| one of `keys`, `none` |" in rows["`auth`"]
    assert "| whole number, 1 to 65535 |" in rows["`port`"]
    for name, field in Settings.model_fields.items():
        assert field.description, f"setting {name} has no description for the table"
        assert " ".join(field.description.split()) in rows[f"`{name}`"].replace("\\|", "|")


def test_update_replaces_a_stale_table_and_keeps_the_rest(tmp_path):
    stale = "\n\n".join(
        f"Before {name}.\n\n{markers(name)[0]}\n| old |\n{markers(name)[1]}\n\nAfter {name}."
        for name in TABLES
    )
    current = update(stale)
    assert current != stale and update(current) == current
    for name, model in TABLES.items():
        assert held(current, name) == render(model)
        assert f"Before {name}." in current and f"After {name}." in current

    path = tmp_path / "configuration.md"
    path.write_text(stale, encoding="utf-8")
    check = argparse.Namespace(write=None, check=path)
    assert settings_docs.settings_command(check) == 1  # stale: --check fails
    assert settings_docs.settings_command(argparse.Namespace(write=path, check=None)) == 0
    assert path.read_text(encoding="utf-8") == current
    assert settings_docs.settings_command(check) == 0


def test_a_page_without_the_markers_is_refused():
    with pytest.raises(ValueError, match="settings-table:start"):
        update("no tables here")

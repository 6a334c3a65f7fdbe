"""Settings that are wrong stop `nnhost serve` with a message, never silently.

Each bad setting runs the real ``nnhost serve`` as a subprocess and checks
that it exits with status 2 before starting anything (no database is made),
with a message naming the key, the value and what is accepted, and no Python
traceback. Then the parts on their own: sizes, durations, precedence and
version comparison.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from pydantic import ValidationError

from nnhost.client_versions import refusal, served_client_versions, serving_version
from nnhost.config import Settings, SettingsError, load_settings
from nnhost.units import format_duration, format_size, parse_duration, parse_size

TOML_CASES = [
    # (what, nnhost.toml, words the message must contain)
    ("a bad boolean", 'containment = "flase"\n',
     ["containment", "'flase'", "true or false"]),
    ("an unknown key", "contanment = false\n",
     ["unknown setting 'contanment'", "did you mean 'containment'"]),
    ("an unknown key under [server]", "[server]\nprot = 9000\n",
     ["unknown setting 'prot'", "did you mean 'port'"]),
    ("a port out of range", "port = 70000\n", ["port", "70000", "at most 65535"]),
    ("a bad size", 'max_result_bytes = "4 gigs"\n',
     ["max_result_bytes", "4 gigs", "KiB, MiB, GiB"]),
    ("an ambiguous size", 'scratch_bytes = "256M"\n',
     ["scratch_bytes", "256M", "256MB", "256MiB"]),
    ("a bad memory budget", 'memory_budget = { cpu = "lots" }\n',
     ["memory_budget.cpu", "'lots'", "GiB"]),
    ("a bad duration", 'result_retention = "1 fortnight"\n',
     ["result_retention", "1 fortnight", "24h"]),
    ("a negative duration", "kill_grace = -1\n", ["kill_grace", "-1", "0 seconds or more"]),
    ("an unserved client version", 'client_versions = ["0.1.0"]\n',
     ["client_versions", "0.1.0", "serves nnsight clients"]),
    ("a bad choice", 'signup = "everyone"\n', ["signup", "'everyone'", "'open'", "'closed'"]),
    ("a bad [[model]] key", '[[model]]\nrepo_id = "org/x"\ndevise = "cpu"\n',
     ["[[model]]", "devise", "known:", "device"]),
    ("[model] for [[model]]", '[model]\nrepo_id = "org/x"\n', ["[[model]]"]),
    ("a bad limits table", "[limits.default]\nrpm = 3\n", ["limits", "rpm", "requests_per_minute"]),
    ("not TOML", "port = = 1\n", ["not valid TOML"]),
]

ENV_CASES = [
    ("a bad boolean", {"NNHOST_CONTAINMENT": "flase"},
     ["containment", "'flase'", "NNHOST_CONTAINMENT", "true or false"]),
    ("an unknown variable", {"NNHOST_CONTAINMNT": "false"},
     ["NNHOST_CONTAINMNT", "not a setting", "did you mean NNHOST_CONTAINMENT"]),
    ("a bad int", {"NNHOST_PORT": "eighty"}, ["port", "'eighty'", "NNHOST_PORT", "whole number"]),
    ("a bad size", {"NNHOST_MAX_LOG_BYTES": "1 megabyte"}, ["max_log_bytes", "1 megabyte"]),
]

FLAG_CASES = [
    ("a negative time limit", ["--time-limit", "-5"], ["time_limit", "-5", "--time-limit"]),
    ("a zero time limit", ["--time-limit", "0"], ["time_limit", "more than 0"]),
    ("an ambiguous memory budget", ["--memory-budget", "cpu=2G"],
     ["memory_budget.cpu", "2G", "2GB", "2GiB"]),
    ("a budget that is not DEVICE=SIZE", ["--memory-budget", "8GiB"], ["memory_budget", "key=value"]),
    ("a missing --config", ["--config", "/nonexistent/nnhost.toml"], ["no such file"]),
]


def serve(tmp_path, args=(), env=None):
    data_dir = tmp_path / "data"
    clean = {k: v for k, v in os.environ.items() if not k.startswith("NNHOST_")}
    clean["HF_HOME"] = str(tmp_path / "hf")
    completed = subprocess.run(
        [sys.executable, "-m", "nnhost.cli", "serve", "org/never-loaded",
         "--data-dir", str(data_dir), *args],
        capture_output=True, text=True, timeout=120, env={**clean, **(env or {})},
    )
    # It stopped before starting anything: no database, no key, no worker.
    assert not (data_dir / "nnhost.sqlite3").exists()
    return completed


def check_refused(completed, words):
    assert completed.returncode == 2, (completed.returncode, completed.stderr)
    assert "Traceback" not in completed.stderr, completed.stderr
    assert completed.stderr.startswith("nnhost serve: "), completed.stderr
    for word in words:
        assert word in completed.stderr, (word, completed.stderr)


@pytest.mark.parametrize("what, toml, words", TOML_CASES, ids=[c[0] for c in TOML_CASES])
def test_a_bad_setting_in_nnhost_toml_stops_serve(tmp_path, what, toml, words):
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "nnhost.toml").write_text(toml)
    completed = serve(tmp_path)
    check_refused(completed, words)
    if "TOML" not in words[0]:
        assert "nnhost.toml" in completed.stderr  # where the value came from


@pytest.mark.parametrize("what, env, words", ENV_CASES, ids=[c[0] for c in ENV_CASES])
def test_a_bad_environment_variable_stops_serve(tmp_path, what, env, words):
    check_refused(serve(tmp_path, env=env), words)


@pytest.mark.parametrize("what, args, words", FLAG_CASES, ids=[c[0] for c in FLAG_CASES])
def test_a_bad_flag_stops_serve(tmp_path, what, args, words):
    check_refused(serve(tmp_path, args), words)


def test_every_problem_is_named_at_once(tmp_path):
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "nnhost.toml").write_text('containment = "flase"\nport = "x"\n')
    completed = serve(tmp_path)
    check_refused(completed, ["containment", "port"])
    assert len(completed.stderr.strip().splitlines()) == 2


# -- the parts on their own ---------------------------------------------------------------


def test_si_and_iec_units_mean_what_they_say():
    assert parse_size("2GB") == 2 * 10**9 and parse_size("2GiB") == 2 * 2**30
    assert parse_size("2 kB") == parse_size("2KB") == 2000 and parse_size("2KiB") == 2048
    assert parse_size("1.5MiB") == 1572864 and parse_size("1TB") == 10**12
    assert parse_size(4096) == parse_size("4096") == parse_size("4096B") == 4096
    assert parse_size("1e6") == 10**6
    for bad in ("2G", "2m", "2 T", "lots", "-1", "", "1.2.3MB", "5XB", True, None, float("inf")):
        with pytest.raises(ValueError):
            parse_size(bad)
    with pytest.raises(ValueError, match="2GB.*2GiB"):
        parse_size("2G")


def test_sizes_are_formatted_in_iec_units():
    assert [format_size(n) for n in (0, 512, 1024, 1536, 10 * 2**20, 4 * 2**30, 2**40)] == [
        "0 B", "512 B", "1 KiB", "1.5 KiB", "10 MiB", "4 GiB", "1 TiB"
    ]
    assert format_size(parse_size("256MiB")) == "256 MiB"
    assert format_size(2**20 - 1) == "1 MiB"  # never "1024 KiB"


def test_durations():
    assert parse_duration(90) == parse_duration("90") == parse_duration("90s") == 90.0
    assert parse_duration("30m") == 1800 and parse_duration("24h") == 86400
    assert parse_duration("30d") == 30 * 86400 and parse_duration("2w") == 14 * 86400
    assert parse_duration("250ms") == 0.25
    for bad in ("soon", "-5", -5, "1 fortnight", "5y", True):
        with pytest.raises(ValueError):
            parse_duration(bad)
    assert format_duration(5400) == "1.5 h" and format_duration(30) == "30 s"


def test_precedence_defaults_toml_environment_flags(tmp_path, monkeypatch):
    for name in list(os.environ):
        if name.startswith("NNHOST_"):
            monkeypatch.delenv(name)
    (tmp_path / "nnhost.toml").write_text(
        'port = 9001\ntime_limit = "2h"\nsignup = "invite"\nmemory_budget = { cpu = "8GB" }\n'
        '[server]\nmax_result_bytes = "2GiB"\n'
    )
    monkeypatch.setenv("NNHOST_PORT", "9002")
    monkeypatch.setenv("NNHOST_TIME_LIMIT", "30m")
    monkeypatch.setenv("NNHOST_MODELS", "org/a,org/b@v1")
    settings = load_settings({"data_dir": str(tmp_path), "time_limit": "90"})
    assert settings.port == 9002  # environment over TOML
    assert settings.time_limit == 90.0  # flag over environment
    assert settings.signup == "invite" and settings.max_result_bytes == 2 * 2**30  # TOML
    assert settings.memory_budget == {"cpu": 8 * 10**9}
    assert settings.models == ["org/a", "org/b@v1"]
    assert settings.containment is True and settings.max_log_bytes == 2**20  # defaults
    monkeypatch.setenv("NNHOST_TEST_ANYTHING", "reserved for tests")  # not a setting, allowed
    monkeypatch.setenv("NNHOST_CONTAINMENT", "off")
    assert load_settings({"data_dir": str(tmp_path)}).containment is False
    monkeypatch.setenv("NNHOST_CONTAINMENT", "flase")
    with pytest.raises(SettingsError, match="containment = 'flase'"):
        load_settings({"data_dir": str(tmp_path)})


def test_settings_keep_attribute_access():
    settings = Settings(time_limit=5, max_log_bytes="64KiB")
    assert settings.time_limit == 5.0 and settings.max_log_bytes == 65536
    settings.allow_trust_remote_code = True
    assert settings.allow_trust_remote_code is True
    assert settings.database_path == settings.data_dir / "nnhost.sqlite3"


def test_a_client_is_served_by_the_runtime_of_its_release():
    served = ["0.8.1", "0.7.0"]
    assert serving_version("0.8.1", served) == "0.8.1" and serving_version("0.7.0", served) == "0.7.0"
    # Pre-, post- and dev releases are their release's; any other release is not served.
    assert serving_version("0.8.1rc1", served) == serving_version("0.8.1.post1", served) == "0.8.1"
    assert serving_version("0.8.0", served) is None and serving_version("0.9.0", served) is None
    assert serving_version("not-a-version", served) == "0.8.1"  # a source tree: let through
    text = refusal("0.6.3", served)
    assert "0.8.1, 0.7.0" in text and "nnsight 0.6.3" in text and "pip install nnsight==0.8.1" in text


def test_only_served_client_versions_may_be_named():
    own = served_client_versions()[0]
    assert Settings(client_versions=own).client_versions == [own]
    with pytest.raises(ValueError, match="this installation serves nnsight clients"):
        Settings(client_versions="0.1.0")


# -- flags generated from the settings ----------------------------------------------------

#: Every flag `nnhost serve` took when each was written out by hand: none may go or change name.
SERVE_SETTING_FLAGS = {
    "host", "port", "data_dir", "database", "demo", "api_key", "public_url", "time_limit",
    "kill_grace", "results", "results_endpoint", "jobs_at_once", "jobs_per_process", "torch_threads", "memory_budget", "auth",
    "allow_insecure", "signup", "cluster", "events", "role", "log_format", "forwarded_allow_ips",
}


def _clean_environment(monkeypatch):
    for name in list(os.environ):
        if name.startswith("NNHOST_"):
            monkeypatch.delenv(name)


def _serve_args(*argv):
    from nnhost.cli import build_parser

    return build_parser().parse_args(["serve", *argv])


def test_the_serve_flags_are_the_settings_marked_flag():
    from nnhost.cli.flags import setting_flags

    assert {name for name, _field, _flag in setting_flags()} == SERVE_SETTING_FLAGS
    for name, field, _flag in setting_flags():
        assert field.description, f"setting {name} has no description for its --help"


def test_every_setting_flag_is_listed_in_serve_help_with_its_help():
    from nnhost.cli.flags import help_text, option, setting_flags

    completed = subprocess.run(
        [sys.executable, "-m", "nnhost.cli", "serve", "--help"],
        capture_output=True, text=True, timeout=60, env={**os.environ, "COLUMNS": "400"},
    )
    assert completed.returncode == 0, completed.stderr
    lines = completed.stdout.splitlines()
    for name, field, _flag in setting_flags():
        listed = [line for line in lines if line.lstrip().startswith(option(name) + " ")
                  or line.strip() == option(name)]
        assert listed, f"{option(name)} is not in `nnhost serve --help`"
        first_words = help_text(field).replace("%%", "%").split()[:3]
        assert " ".join(first_words) in completed.stdout, (name, first_words)
    for explicit in ("--config", "--log-level", "MODEL_ID"):
        assert explicit in completed.stdout


def test_flags_take_the_values_their_settings_accept():
    args = _serve_args(
        "org/a", "org/b@v1", "--port", "9100", "--demo", "--signup", "invite",
        "--memory-budget", "cpu=2GiB", "--memory-budget", "cuda:0=3GB", "--torch-threads", "2",
        "--time-limit", "30m", "--forwarded-allow-ips", "10.0.0.1,10.0.0.2",
    )
    from nnhost.cli.flags import given

    values = given(args)
    assert values["port"] == 9100 and values["torch_threads"] == 2  # whole numbers, as before
    assert values["demo"] is True and values["allow_insecure"] is None  # a switch not given
    assert values["memory_budget"] == "cpu=2GiB,cuda:0=3GB"
    assert values["time_limit"] == "30m"  # parsed by the setting, not by argparse
    assert values["host"] is None and args.models == ["org/a", "org/b@v1"]
    for bad in (["--signup", "everyone"], ["--port", "eighty"], ["--role", "worker"]):
        with pytest.raises(SystemExit) as exited:
            _serve_args(*bad)
        assert exited.value.code == 2


def test_a_flag_wins_over_the_environment_which_wins_over_nnhost_toml(tmp_path, monkeypatch):
    from nnhost.cli.flags import given

    _clean_environment(monkeypatch)
    (tmp_path / "nnhost.toml").write_text(
        'port = 9001\nsignup = "closed"\nlog_format = "json"\ntorch_threads = 3\n'
    )
    monkeypatch.setenv("NNHOST_PORT", "9002")
    monkeypatch.setenv("NNHOST_SIGNUP", "invite")
    monkeypatch.setenv("NNHOST_MEMORY_BUDGET", "cpu=1GiB")
    args = _serve_args("--data-dir", str(tmp_path), "--port", "9003", "--memory-budget", "cpu=2GiB")
    settings = load_settings({**given(args), "models": args.models or None})
    assert settings.port == 9003  # the flag over the environment and the file
    assert settings.memory_budget == {"cpu": 2 * 2**30}  # the flag over the environment
    assert settings.signup == "invite"  # no flag: the environment over the file
    assert settings.log_format == "json" and settings.torch_threads == 3  # the file
    assert settings.host == "127.0.0.1" and settings.demo is False  # defaults
    assert settings.data_dir == tmp_path.resolve()


def test_a_bad_flag_value_names_the_flag(tmp_path, monkeypatch):
    from nnhost.cli.flags import given

    _clean_environment(monkeypatch)
    args = _serve_args("--data-dir", str(tmp_path), "--kill-grace", "soon")
    with pytest.raises(SettingsError, match=r"kill_grace = 'soon' \(from --kill-grace\)"):
        load_settings(given(args))


# -- [[model]] entries and settings that go together -----------------------------------


def _settings_from(tmp_path, monkeypatch, toml, **flags):
    _clean_environment(monkeypatch)
    (tmp_path / "nnhost.toml").write_text(toml)
    return load_settings({"data_dir": str(tmp_path), **flags})


@pytest.mark.parametrize("table, words", [
    ('repo_id = "org/x"\nrevison = "v1"',
     ["[[model]] 'org/x'", "unknown key 'revison'", "did you mean 'revision'", "known:"]),
    ('repo_id = "org/x"\ndeploy = "lukewarm"', ["[[model]] 'org/x'", "deploy", "'hot'"]),
    ('repo_id = "org/x"\nreplicas = 0', ["[[model]] 'org/x'", "replicas", "at least 1"]),
    ('repo_id = "org/x"\nreplicas = 2\nmax_replicas = 1', ["max_replicas must be at least replicas"]),
    ('repo_id = "org/x"\nquantization = "int3"', ["quantization 'int3'"]),
    ('dtype = "float16"', ["every [[model]] needs a repo_id"]),
])
def test_a_bad_model_entry_is_refused_naming_it(tmp_path, monkeypatch, table, words):
    with pytest.raises(SettingsError) as refused:
        _settings_from(tmp_path, monkeypatch, f"[[model]]\n{table}\n")
    message = str(refused.value)
    for word in words:
        assert word in message, (word, message)
    assert "nnhost.toml" in message


def test_model_entries_load_as_the_specs_they_name(tmp_path, monkeypatch):
    from nnhost.config import ModelEntry
    from nnhost.models.catalog import ModelSpec

    settings = _settings_from(
        tmp_path, monkeypatch,
        '[[model]]\nrepo_id = "org/x"\ndeploy = "cold"\nreplicas = 2\n'
        'load_kwargs = { attn_implementation = "eager" }\n',
    )
    (entry,) = settings.catalog
    assert isinstance(entry, ModelEntry)
    assert entry.spec() == ModelSpec(
        repo_id="org/x", deploy="cold", replicas=2, load_kwargs={"attn_implementation": "eager"}
    )
    with pytest.raises(ValidationError, match="frozen"):
        entry.replicas = 3  # an entry is never changed


def test_settings_that_cannot_go_together_are_refused(tmp_path, monkeypatch):
    with pytest.raises(SettingsError, match="--role api needs --events redis://"):
        _settings_from(tmp_path, monkeypatch, 'role = "api"\n')
    with pytest.raises(SettingsError, match="results_endpoint .* only used with s3:// results"):
        _settings_from(tmp_path, monkeypatch, "", results_endpoint="http://127.0.0.1:9000")
    settings = _settings_from(
        tmp_path, monkeypatch, 'role = "api"\nevents = "redis://127.0.0.1:6379"\n'
    )
    assert settings.role == "api"


def test_the_other_commands_take_their_settings_flags_from_the_settings_too(tmp_path):
    from nnhost.cli import build_parser
    from nnhost.cli.flags import given

    parser = build_parser()
    database = f"sqlite:///{tmp_path / 'elsewhere.sqlite3'}"
    args = parser.parse_args(["keys", "create", "--data-dir", str(tmp_path), "--database", database])
    assert {k: v for k, v in given(args).items() if v is not None} == {
        "data_dir": str(tmp_path), "database": database,
    }
    args = parser.parse_args(["demo-model", "--data-dir", str(tmp_path)])
    assert given(args)["data_dir"] == str(tmp_path)
    with pytest.raises(SystemExit):
        parser.parse_args(["users", "list", "--port", "9000"])  # a serve flag only

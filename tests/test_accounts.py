"""Accounts, API keys and who may see what.

Against a real server of its own (its nnhost.toml sets per-tag limits), driven
by the real nnsight client and by the ``nnhost`` CLI: two users each see only
their own jobs and results; revoked, expired and disabled keys stop working at
once; limits give 429 with Retry-After and then recover. The page and
throttling rules that need odd settings run in-process on an app with no
models. The last test scans the database files for any secret in clear.
"""

from __future__ import annotations

import contextlib
import json
import re
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from compare import assert_same
from conftest import API_KEY, TEST_REPO

from nnhost.auth.access import settings_problem
from nnhost.auth.limits import (
    FailureCounter,
    LimitPolicy,
    LimitsConfigError,
    RequestRate,
    parse_size,
)
from nnhost.cli.people import parse_expiry
from nnhost.config import Settings, load_settings
from nnhost.testing import ServerProcess

PROMPT = "The Eiffel Tower is in the city of"
MODEL_KEY = (
    'nnsight.modeling.transformers.TransformersModel:{"repo_id": "%s", '
    '"revision": null, "task": "text-generation"}' % TEST_REPO
)
CONFIG_TOML = """
[server]
signup = "open"

[limits.default]
requests_per_minute = 600
queued_jobs = 8

[limits.throttled]
requests_per_minute = 60
burst = 3

[limits.single]
queued_jobs = 1

[limits.small]
request_bytes = "2KB"
"""

#: Every key, password and invite code these tests make: none may be in the database.
SECRETS: list[str] = []


# -- fixtures and helpers -------------------------------------------------------------


@pytest.fixture(scope="module")
def accounts_server(root, server_hf_home, test_snapshot):
    data_dir = root / "accounts-data"
    data_dir.mkdir(parents=True, exist_ok=True)
    (data_dir / "nnhost.toml").write_text(CONFIG_TOML)
    process = ServerProcess([TEST_REPO], data_dir=data_dir, hf_home=server_hf_home, api_key=API_KEY)
    process.start()
    yield process
    process.stop()


def cli(data_dir: Path, *args: str, input: str | None = None, check: bool = True):
    result = subprocess.run(
        [sys.executable, "-m", "nnhost.cli", *args, "--data-dir", str(data_dir)],
        input=input,
        capture_output=True,
        text=True,
        timeout=60,
    )
    if check:
        assert result.returncode == 0, result.stderr
    return result


def make_user(server, email: str, *tags: str, password: str | None = None) -> str:
    """Add a user with the CLI and return a new key of theirs."""
    args = ["users", "add", email]
    for tag in tags:
        args += ["--tag", tag]
    if password:
        args.append("--password")
        SECRETS.append(password)
    cli(server.data_dir, *args, input=(password + "\n") if password else None)
    return new_key(server, email)


def new_key(server, email: str, *extra: str) -> str:
    key = cli(server.data_dir, "keys", "create", "--email", email, *extra).stdout.strip()
    assert key.startswith("nnh_") and len(key) > 40
    SECRETS.append(key)
    return key


@contextlib.contextmanager
def as_client(server, key: str):
    """Point the nnsight client at ``server`` with ``key`` for the duration."""
    from nnsight import CONFIG

    previous = CONFIG.API.HOST, CONFIG.API.APIKEY
    CONFIG.API.HOST, CONFIG.API.APIKEY = server.url, key
    try:
        yield
    finally:
        CONFIG.API.HOST, CONFIG.API.APIKEY = previous


def trace(model, server, key: str):
    with as_client(server, key):
        with model.trace(PROMPT, remote=True):
            logits = model.lm_head.output.save()
    return logits


def submit(model, server, key: str) -> str:
    """A non-blocking request; returns its job id."""
    with as_client(server, key):
        with model.trace(PROMPT, remote=True, blocking=False) as tracer:
            logits = model.lm_head.output.save()
    return tracer.backend.job_id


def wait_done(server, key: str, job_id: str, timeout: float = 60) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        latest = httpx.get(f"{server.url}/response/{job_id}", headers={"ndif-api-key": key})
        assert latest.status_code == 200, latest.text
        if latest.json()["status"] in ("COMPLETED", "ERROR"):
            return latest.json()
        time.sleep(0.1)
    raise AssertionError(f"job {job_id} did not finish")


def post(server, key: str, blob: bytes = b"x", model_key: str = MODEL_KEY, session_id: str = ""):
    return httpx.post(
        f"{server.url}/request",
        data={"data": json.dumps({"model_key": model_key, "session_id": session_id})},
        files={"blob": ("request", blob, "application/octet-stream")},
        headers={"ndif-api-key": key, "nnsight-version": "0.8.1"},
    )


def csrf_of(html: str) -> str:
    return re.search(r'name="csrf" value="([^"]+)"', html).group(1)


@contextlib.contextmanager
def web_login(base_url: str, email: str, password: str):
    """An HTTP client logged in to the pages as ``email``."""
    with httpx.Client(base_url=base_url, follow_redirects=True) as client:
        page = client.get("/login")
        response = client.post(
            "/login", data={"email": email, "password": password, "csrf": csrf_of(page.text)}
        )
        assert response.status_code == 200 and str(response.url).endswith("/keys"), response.text
        yield client


@pytest.fixture(scope="module")
def alice(accounts_server):
    return make_user(accounts_server, "alice@example.org", password="alice-password-1")


@pytest.fixture(scope="module")
def bob(accounts_server):
    return make_user(accounts_server, "bob@example.org", password="bob-password-22")


# -- two users -------------------------------------------------------------------------


def test_two_users_see_only_their_own_jobs_and_results(
    accounts_server, alice, bob, remote_model, local_model
):
    server = accounts_server
    logits = trace(remote_model, server, alice)
    with local_model.trace(PROMPT):
        expected = local_model.lm_head.output.save()
    assert_same({"logits": logits}, {"logits": expected})

    alice_job = submit(remote_model, server, alice)
    bob_job = submit(remote_model, server, bob)
    done = wait_done(server, alice, alice_job)
    assert done["status"] == "COMPLETED"
    assert wait_done(server, bob, bob_job)["status"] == "COMPLETED"

    # Another user's job id is "not found", word for word like a job that doesn't exist.
    theirs = httpx.get(f"{server.url}/response/{alice_job}", headers={"ndif-api-key": bob})
    missing = httpx.get(f"{server.url}/response/{'0' * 32}", headers={"ndif-api-key": bob})
    assert theirs.status_code == missing.status_code == 404
    assert theirs.json()["detail"].replace(alice_job, "ID") == missing.json()["detail"].replace(
        "0" * 32, "ID"
    )
    with as_client(server, bob):
        from nnsight.intervention.backends.remote import RemoteBackend

        peek = RemoteBackend(remote_model.to_model_key(), blocking=False, job_id=alice_job)
        assert peek() is None  # bob's client learns nothing about alice's job

    # The result link is signed for alice's job: it works with no key (the client
    # downloads it that way), but not for another job, nor once its signature expires.
    url = done["data"]
    assert httpx.get(url).status_code == 200
    assert httpx.get(url.replace(alice_job, bob_job)).status_code == 403
    from nnhost.storage.links import LinkSigner

    signer = LinkSigner.from_file(server.data_dir / "secrets" / "link-signing.key")
    past = int(time.time()) - 5
    stale = f"{server.url}/result/{alice_job}?expires={past}&sig={signer.sign(alice_job, past)}"
    assert httpx.get(stale).status_code == 403

    # The jobs pages show each user their own jobs only.
    with web_login(server.url, "alice@example.org", "alice-password-1") as browser:
        page = browser.get("/jobs").text
        assert alice_job in page and bob_job not in page
        assert TEST_REPO in page and "COMPLETED" in page and "/result/" + alice_job in page
        assert browser.get(f"/jobs/{alice_job}").status_code == 200
        assert browser.get(f"/jobs/{bob_job}").status_code == 404
    with web_login(server.url, "bob@example.org", "bob-password-22") as browser:
        page = browser.get("/jobs").text
        assert bob_job in page and alice_job not in page


def test_websocket_updates_go_only_to_their_owner(accounts_server, alice, bob):
    import websocket

    server = accounts_server
    socket = websocket.create_connection(
        server.url.replace("http", "ws") + "/subscribe", header=[f"ndif-api-key: {bob}"], timeout=10
    )
    try:
        session_id = json.loads(socket.recv())["session_id"]
        refused = post(server, alice, session_id=session_id)
        assert refused.status_code == 403 and "session" in refused.json()["detail"]
        socket.settimeout(1.0)
        with pytest.raises(websocket.WebSocketTimeoutException):
            socket.recv()  # nothing of alice's reaches bob's socket
    finally:
        socket.close()


def test_whoami_names_the_key_owner_and_tags(accounts_server):
    key = make_user(accounts_server, "whoami@example.org", "priority", "trusted")
    import nnsight

    with as_client(accounts_server, key):
        assert nnsight.whoami() == {"email": "whoami@example.org", "tags": ["priority", "trusted"]}


# -- keys that stop working ------------------------------------------------------------------


def test_a_revoked_key_stops_working_at_once(accounts_server, remote_model):
    from nnsight.intervention.backends.remote import RemoteError

    server = accounts_server
    key = make_user(server, "revoke@example.org")
    other = new_key(server, "revoke@example.org")
    trace(remote_model, server, key)
    listing = cli(server.data_dir, "keys", "list", "--email", "revoke@example.org").stdout
    assert key[:12] in listing and key not in listing

    cli(server.data_dir, "keys", "revoke", key[:12])
    with pytest.raises(RemoteError, match="revoked"):
        trace(remote_model, server, key)
    assert "revoked" in cli(server.data_dir, "keys", "list", "--email", "revoke@example.org").stdout
    # The user's other key still works.
    trace(remote_model, server, other)


def test_an_expired_key_is_refused(accounts_server, remote_model):
    from nnsight.intervention.backends.remote import RemoteError

    server = accounts_server
    cli(server.data_dir, "users", "add", "expire@example.org")
    key = new_key(server, "expire@example.org", "--expires", "1s")
    time.sleep(1.2)
    with pytest.raises(RemoteError, match="expired"):
        trace(remote_model, server, key)
    response = post(server, key)
    assert response.status_code == 403 and "expired" in response.json()["detail"]


def test_a_disabled_user_is_refused_until_enabled(accounts_server, remote_model):
    from nnsight.intervention.backends.remote import RemoteError

    server = accounts_server
    key = make_user(server, "disable@example.org", password="disable-me-123")
    cli(server.data_dir, "users", "disable", "disable@example.org")
    assert "disabled" in cli(server.data_dir, "users", "list").stdout
    with pytest.raises(RemoteError, match="disabled"):
        trace(remote_model, server, key)
    with httpx.Client(base_url=server.url) as browser:
        page = browser.get("/login")
        refused = browser.post(
            "/login",
            data={"email": "disable@example.org", "password": "disable-me-123",
                  "csrf": csrf_of(page.text)},
        )
        assert refused.status_code == 401 and "disabled" in refused.text
    cli(server.data_dir, "users", "enable", "disable@example.org")
    trace(remote_model, server, key)


# -- limits ----------------------------------------------------------------------------------


def test_requests_per_minute_give_429_then_recover(accounts_server, remote_model):
    from nnsight.intervention.backends.remote import RemoteError

    server = accounts_server
    key = make_user(server, "throttled@example.org", "throttled")
    # A burst of 3 (each refused later, for its bad model key, but counted), then 429.
    for _ in range(3):
        assert post(server, key, model_key="not-a-model-key").status_code == 422
    refused = post(server, key)
    assert refused.status_code == 429
    assert refused.headers["retry-after"] == "1"
    assert "Too many requests" in refused.json()["detail"]
    assert "60 requests a minute (up to 3 at once)" in refused.json()["detail"]
    with pytest.raises(RemoteError, match="Too many requests"):
        trace(remote_model, server, key)
    time.sleep(int(refused.headers["retry-after"]) + 0.1)
    trace(remote_model, server, key)


def test_queued_jobs_limit_gives_429_then_recovers(accounts_server, remote_model):
    from nnsight.intervention.backends.remote import RemoteError

    server = accounts_server
    key = make_user(server, "single@example.org", "single")
    with as_client(server, key):
        with remote_model.trace(PROMPT, remote=True, blocking=False) as tracer:
            time.sleep(2)
            logits = remote_model.lm_head.output.save()
    slow_job = tracer.backend.job_id
    refused = post(server, key)
    assert refused.status_code == 429 and int(refused.headers["retry-after"]) >= 1
    assert "already have 1 request waiting or running" in refused.json()["detail"]
    with pytest.raises(RemoteError, match="Wait for one to finish"):
        trace(remote_model, server, key)
    assert wait_done(server, key, slow_job)["status"] == "COMPLETED"
    trace(remote_model, server, key)


def test_request_size_limit_per_tag(accounts_server, alice):
    server = accounts_server
    key = make_user(server, "small@example.org", "small")
    refused = post(server, key, blob=b"x" * 5000)
    assert refused.status_code == 413 and "2,000 bytes" in refused.json()["detail"]
    # The same body is fine for a user without the tag.
    assert post(server, alice, blob=b"x" * 5000).status_code == 200


# -- the pages and rules, in-process ---------------------------------------------------


@contextlib.contextmanager
def app_client(tmp_path, base_url="http://127.0.0.1", **settings):
    from fastapi.testclient import TestClient

    from nnhost.app import create_app
    from nnhost.models.catalog import Catalog

    config = Settings(data_dir=tmp_path / "data", **settings)
    with TestClient(create_app(config, Catalog([])), base_url=base_url) as client:
        yield client


def sign_up(client, email, password, invite=""):
    page = client.get("/signup")
    data = {"email": email, "password": password, "confirm": password, "invite": invite,
            "csrf": csrf_of(page.text)}
    return client.post("/signup", data=data)


def test_forms_need_the_csrf_token_of_their_session(tmp_path):
    with app_client(tmp_path) as client:
        data = {"email": "eve@example.org", "password": "password-123", "confirm": "password-123"}
        assert client.post("/signup", data=data).status_code == 403
        assert client.post("/signup", data={**data, "csrf": "0" * 64}).status_code == 403
        anonymous_token = csrf_of(client.get("/signup").text)
        signed = client.post("/signup", data={**data, "csrf": anonymous_token})
        assert signed.status_code == 200 and "Welcome" in signed.text
        # Signed in, a form needs the session's token; the pre-login one no longer counts.
        session_token = csrf_of(signed.text)
        assert session_token != anonymous_token
        assert client.post("/keys", data={"name": "x", "csrf": anonymous_token}).status_code == 403
        assert client.post("/keys", data={"name": "x"}).status_code == 403
        made = client.post("/keys", data={"name": "x", "expires": "never", "csrf": session_token})
        assert made.status_code == 201 and "nnh_" in made.text


def test_session_cookies_are_httponly_samesite_and_secure_over_https(tmp_path):
    with app_client(tmp_path, base_url="https://nnhost.example") as client:
        response = sign_up(client, "ada@example.org", "password-123")
        cookie = response.history[0].headers["set-cookie"]
        assert cookie.startswith("nnhost_session=")
        for flag in ("HttpOnly", "Secure", "SameSite=lax"):
            assert flag in cookie, cookie
        token = cookie.split(";")[0].split("=", 1)[1]
        assert token.encode() not in read_database(tmp_path / "data")
    with app_client(tmp_path, base_url="http://127.0.0.1") as client:
        response = sign_up(client, "bea@example.org", "password-123")
        assert "Secure" not in response.history[0].headers["set-cookie"]
        # Logging out ends the session on the server, not just in the browser.
        client.post("/logout", data={"csrf": csrf_of(response.text)})
        assert str(client.get("/keys").url).endswith("/login?next=/keys")


def test_invite_only_signup(tmp_path):
    with app_client(tmp_path, signup="invite") as client:
        code = cli(tmp_path / "data", "invites", "create", "--tag", "priority").stdout.strip()
        SECRETS.append(code)
        refused = sign_up(client, "ivy@example.org", "password-123")
        assert refused.status_code == 400 and "invite code" in refused.text
        assert sign_up(client, "ivy@example.org", "password-123", "inv_wrong").status_code == 400
        accepted = sign_up(client, "ivy@example.org", "password-123", code)
        assert accepted.status_code == 200 and "ivy@example.org" in accepted.text
        assert '<span class="tag">priority</span>' in accepted.text
        client.cookies.clear()
        again = sign_up(client, "ivan@example.org", "password-123", code)
        assert again.status_code == 400 and "not valid" in again.text
        listing = cli(tmp_path / "data", "invites", "list").stdout
        assert "ivy@example.org" in listing and code not in listing


def test_closed_signup(tmp_path):
    with app_client(tmp_path, signup="closed") as client:
        page = client.get("/signup")
        assert page.status_code == 403 and "does not take sign-ups" in page.text
        refused = client.post(
            "/signup",
            data={"email": "x@example.org", "password": "password-123", "confirm": "password-123",
                  "csrf": csrf_of(client.get("/login").text)},
        )
        assert refused.status_code == 403


def test_wrong_passwords_are_throttled_per_address(tmp_path):
    with app_client(tmp_path, auth_failure_limit=3, auth_failure_window=1.5) as client:
        # The server's own password counters, as its settings made them, on a clock
        # of the test's: three slow password checks on a loaded machine no longer
        # outlast the window before the fourth attempt (it failed 2 runs in 5).
        access = client.app.state.server.access
        now = [1000.0]
        for name in ("password_failures", "address_password_failures"):
            made = getattr(access, name)
            assert (made.limit, made.window) == (3, 1.5)
            setattr(access, name, FailureCounter(made.limit, made.window, lambda: now[0], name=made.name))
        sign_up(client, "pat@example.org", "right-password")
        client.cookies.clear()
        token = csrf_of(client.get("/login").text)

        def attempt(password):
            return client.post(
                "/login", data={"email": "pat@example.org", "password": password, "csrf": token}
            )

        assert [attempt("wrong-password").status_code for _ in range(3)] == [401, 401, 401]
        refused = attempt("right-password")  # even the right one, while the address is blocked
        assert refused.status_code == 429 and int(refused.headers["retry-after"]) >= 1
        assert "Too many failed attempts" in refused.text
        now[0] += 1.4  # still inside the window
        assert attempt("right-password").status_code == 429
        now[0] += 0.2  # past it
        assert attempt("right-password").status_code == 200


def test_wrong_keys_slow_further_failures_but_never_a_valid_key(tmp_path):
    with app_client(tmp_path, auth_failure_limit=3, auth_failure_window=1.5) as client:
        key = cli(tmp_path / "data", "keys", "create").stdout.strip()
        SECRETS.append(key)

        def ask(with_key):
            return client.get(f"/response/{'0' * 32}", headers={"ndif-api-key": with_key})

        assert ask(key).status_code == 404
        assert [ask(f"nnh_guess{i}").status_code for i in range(3)] == [403, 403, 403]
        refused = ask("nnh_guess_again")
        assert refused.status_code == 429 and refused.headers["retry-after"] in ("1", "2")
        assert "Too many failed API keys" in refused.json()["detail"]
        # The right key from the same address still works: failures slow only failures.
        assert ask(key).status_code == 404
        assert client.get("/whoami", headers={"ndif-api-key": key}).json()["email"] == (
            "admin@localhost"
        )
        time.sleep(1.6)
        assert ask("nnh_guess_later").status_code == 403


def test_auth_none_makes_everyone_the_local_admin(tmp_path):
    with app_client(tmp_path, auth="none") as client:
        assert client.get("/whoami").json() == {"email": "admin@localhost", "tags": ["admin"]}
        assert client.get(f"/response/{'0' * 32}").status_code == 404  # not 401
        page = client.get("/keys")
        assert page.status_code == 200 and "admin@localhost" in page.text


def test_auth_none_is_refused_on_a_public_address(tmp_path):
    command = subprocess.run(
        [sys.executable, "-m", "nnhost.cli", "serve", TEST_REPO, "--auth", "none",
         "--host", "0.0.0.0", "--data-dir", str(tmp_path)],
        capture_output=True, text=True, timeout=60,
    )
    assert command.returncode == 2
    assert "--auth none" in command.stderr and "--allow-insecure" in command.stderr
    assert settings_problem(Settings(auth="none", host="0.0.0.0", allow_insecure=True)) is None
    for host in ("127.0.0.1", "localhost", "::1", "127.0.0.2"):
        assert settings_problem(Settings(auth="none", host=host)) is None


def test_another_users_job_page_is_not_found(tmp_path):
    from nnhost.jobs.job import Job

    with app_client(tmp_path) as client:
        sign_up(client, "one@example.org", "password-one")
        one = client.app.state.server.keys.user_by_email("one@example.org")
        client.app.state.server.jobs.store.create(
            Job(id="a" * 32, user_id=one.user_id, model_key=MODEL_KEY, deployment=TEST_REPO)
        )
        assert client.get("/jobs/" + "a" * 32).status_code == 200
        client.cookies.clear()
        sign_up(client, "two@example.org", "password-two")
        assert client.get("/jobs/" + "a" * 32).status_code == 404
        assert "a" * 32 not in client.get("/jobs").text


# -- the parts on their own ----------------------------------------------------------------


def test_limits_combine_per_tag_and_refuse_bad_tables():
    policy = LimitPolicy(
        {
            "default": {"requests_per_minute": 10, "queued_jobs": 2},
            "priority": {"requests_per_minute": 100, "request_bytes": "1MiB"},
            "restricted": {"requests_per_minute": 5},
        },
        max_request_bytes=1000,
    )
    plain = policy.for_tags(())
    assert (plain.requests_per_minute, plain.queued_jobs, plain.request_bytes) == (10, 2, 1000)
    vip = policy.for_tags(("priority", "restricted"))
    assert (vip.requests_per_minute, vip.queued_jobs, vip.request_bytes) == (100, 2, 1024 * 1024)
    admin = policy.for_tags(("admin",))
    assert (admin.requests_per_minute, admin.queued_jobs) == (0, 0)
    assert parse_size("2KB") == 2000 and parse_size("1.5GiB") == int(1.5 * 1024**3)
    with pytest.raises(LimitsConfigError, match="ambiguous"):
        LimitPolicy({"x": {"request_bytes": "2G"}}, max_request_bytes=1)
    with pytest.raises(LimitsConfigError, match="unknown setting 'rpm'"):
        LimitPolicy({"default": {"rpm": 3}}, max_request_bytes=1)
    with pytest.raises(LimitsConfigError, match="negative"):
        LimitPolicy({"x": {"queued_jobs": -1}}, max_request_bytes=1)


def test_limit_tables_load_from_toml_beside_a_server_table(tmp_path):
    (tmp_path / "nnhost.toml").write_text(CONFIG_TOML)
    settings = load_settings({"data_dir": str(tmp_path)})
    assert settings.signup == "open"
    assert settings.limits["throttled"] == {"requests_per_minute": 60, "burst": 3}
    with pytest.raises(ValueError, match="unknown setting 'requests'"):
        Settings(limits={"default": {"requests": 1}})


def test_token_bucket_and_failure_window_with_a_fake_clock():
    now = [0.0]
    clock = lambda: now[0]  # noqa: E731
    rate = RequestRate(clock)
    limits = LimitPolicy({"t": {"requests_per_minute": 30, "burst": 2}}, max_request_bytes=1)
    limits = limits.for_tags(("t",))
    assert [rate.take("u", limits) for _ in range(2)] == [0.0, 0.0]
    assert rate.take("u", limits) == pytest.approx(2.0)
    assert rate.take("other", limits) == 0.0
    now[0] = 2.0
    assert rate.take("u", limits) == 0.0

    now[0] = 0.0
    failures = FailureCounter(limit=2, window=10, clock=clock)
    failures.record("1.2.3.4")
    now[0] = 3.0
    failures.record("1.2.3.4")
    assert failures.blocked_for("1.2.3.4") == pytest.approx(7.0)
    assert failures.blocked_for("5.6.7.8") == 0.0
    now[0] = 12.5
    assert failures.blocked_for("1.2.3.4") == 0.0


def test_key_expiry_parsing():
    assert parse_expiry("30d", now=0) == 30 * 86400
    assert parse_expiry("12h", now=10) == 10 + 12 * 3600
    assert parse_expiry("never") is None
    assert parse_expiry("2030-01-31") == pytest.approx(1896048000.0)
    with pytest.raises(Exception, match="not an expiry"):
        parse_expiry("soon")


# -- nothing secret in clear -------------------------------------------------------------


def read_database(data_dir: Path) -> bytes:
    """Every byte of the server's database, its write-ahead log included."""
    blobs = b""
    for path in sorted(data_dir.glob("nnhost.sqlite3*")):
        blobs += path.read_bytes()
    assert blobs, f"no database in {data_dir}"
    return blobs


def test_the_database_holds_no_key_or_password_in_clear(accounts_server):
    # Its own user, so the scan has something to look for even when run alone.
    make_user(accounts_server, "scan@example.org", password="scan-password-1")
    database = read_database(accounts_server.data_dir)
    assert len(SECRETS) >= 2
    for secret in SECRETS + [API_KEY]:
        assert secret.encode() not in database, f"{secret[:8]}... is in the database in clear"
    # What is there instead: argon2id hashes of the passwords, SHA-256 of the keys.
    assert b"$argon2id$" in database
    from nnhost.auth.keys import hash_key

    assert hash_key(SECRETS[-1]).encode() in database

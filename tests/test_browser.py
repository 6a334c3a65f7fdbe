"""The account pages in a real browser: headless Chromium driven by Playwright.

A person signs up, logs out and in, makes an API key and copies it with the
copy button, uses it from the nnsight client, finds the job on the jobs page,
revokes the key, and the client is refused. A screenshot of each page is saved
under ``test-output/screenshots/``.

The browser is Debian's ``chromium`` (``make install`` installs it when it is
missing and it can); Playwright drives it through ``executable_path``, so no
browser is downloaded. Without it these tests fail in CI and are skipped, with
the reason, elsewhere.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from pathlib import Path

import httpx
import pytest
from conftest import TEST_REPO

CHROMIUM = os.environ.get("NNHOST_TEST_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
SHOTS = Path(__file__).resolve().parents[1] / "test-output" / "screenshots"
EMAIL = "grace@example.org"
PASSWORD = "a long browser password"
PROMPT = "The Eiffel Tower is in the city of"


def _unavailable(reason: str):
    message = f"browser tests need {reason}; `make install` sets it up (apt-get install chromium)"
    if os.environ.get("CI"):
        pytest.fail(message, pytrace=False)
    pytest.skip(message)


@pytest.fixture(scope="module")
def browser():
    if not (os.path.isfile(CHROMIUM) and os.access(CHROMIUM, os.X_OK)):
        _unavailable(f"Chromium at {CHROMIUM}")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        _unavailable("Playwright for Python (pip install -e .[test])")
    shutil.rmtree(SHOTS, ignore_errors=True)
    SHOTS.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield chromium
        chromium.close()


class Camera:
    """Numbered full-page screenshots, in the order the pages were seen."""

    def __init__(self, directory: Path = SHOTS) -> None:
        self.count = 0
        self.directory = directory

    def __call__(self, page, name: str) -> Path:
        self.count += 1
        path = self.directory / f"{self.count:02d}-{name}.png"
        page.screenshot(path=str(path), full_page=True)
        return path


@contextlib.contextmanager
def using_key(key: str):
    from nnsight import CONFIG

    previous = CONFIG.API.APIKEY
    CONFIG.API.APIKEY = key
    try:
        yield
    finally:
        CONFIG.API.APIKEY = previous


def trace(model):
    with model.trace(PROMPT, remote=True):
        logits = model.lm_head.output.save()
    return logits


def test_sign_up_make_a_key_use_it_see_the_job_and_revoke_it(server, browser, remote_model, root):
    import nnsight
    from nnsight.intervention.backends.remote import RemoteError

    shot = Camera()
    context = browser.new_context(base_url=server.url, viewport={"width": 1100, "height": 720})
    context.grant_permissions(["clipboard-read", "clipboard-write"], origin=server.url)
    page = context.new_page()

    # Sign up.
    page.goto("/")  # the status page, with sign-up in its header
    assert page.locator("[data-testid=models]").count() == 1
    page.click("nav >> text=Sign up")
    shot(page, "signup")
    page.fill("input[name=email]", EMAIL)
    page.fill("input[name=password]", PASSWORD)
    page.fill("input[name=confirm]", PASSWORD)
    page.click("button[type=submit]:has-text('Create account')")
    page.wait_for_url("**/keys?welcome=1")
    assert "Welcome" in page.inner_text(".notice")
    assert page.inner_text("[data-testid=email]") == EMAIL
    shot(page, "keys-after-signup")

    # Log out, fail once, log in.
    page.click("button:has-text('Log out')")
    page.wait_for_url("**/login")
    shot(page, "login")
    page.fill("input[name=email]", EMAIL)
    page.fill("input[name=password]", "not the password")
    page.click("button[type=submit]:has-text('Log in')")
    assert "don't match" in page.inner_text(".error")
    shot(page, "login-wrong-password")
    page.fill("input[name=password]", PASSWORD)
    page.click("button[type=submit]:has-text('Log in')")
    page.wait_for_url("**/keys")

    # Make a key and copy it with the button.
    page.fill("input[name=name]", "browser test")
    page.select_option("select[name=expires]", "30 days")
    page.click("button:has-text('Create key')")
    page.wait_for_selector("[data-testid=new-key]")
    shown = page.inner_text("#new-key-value").strip()
    page.click("button[data-copy='#new-key-value']")
    page.wait_for_selector("button.copy.done")
    key = page.evaluate("navigator.clipboard.readText()")
    assert key == shown and key.startswith("nnh_")
    row = page.locator(f"tr[data-key-prefix='{key[:12]}']")
    assert "active" in row.inner_text() and "browser test" in row.inner_text()
    shot(page, "key-created-and-copied")
    # Shown once: a reload of the key page no longer has it.
    page.goto("/keys")
    assert key not in page.content()

    # Use it from the nnsight client.
    with using_key(key):
        assert nnsight.whoami() == {"email": EMAIL, "tags": []}
        logits = trace(remote_model)
    assert logits.shape[-1] == remote_model.config.vocab_size

    # The job is on the jobs page, with a link to its result.
    page.click("nav >> text=Jobs")
    page.wait_for_url("**/jobs")
    rows = page.locator("tr[data-job-id]")
    assert rows.count() == 1
    text = rows.first.inner_text()
    assert "COMPLETED" in text and TEST_REPO in text
    link = rows.first.locator("a.result").get_attribute("href")
    download = httpx.get(link)
    assert download.status_code == 200 and len(download.content) > 0
    shot(page, "jobs")
    rows.first.locator("td a").first.click()
    page.wait_for_url("**/jobs/*")
    assert "COMPLETED" in page.inner_text("dl.facts")
    shot(page, "job")

    # Revoke the key; the client is refused from then on.
    page.click("nav >> text=API keys")
    page.click(f"button[data-revoke='{key[:12]}']")
    page.wait_for_url("**/keys?revoked=*")
    assert "revoked" in page.inner_text(".notice")
    assert "revoked" in page.locator(f"tr[data-key-prefix='{key[:12]}']").inner_text()
    shot(page, "key-revoked")
    with using_key(key):
        with pytest.raises(RemoteError, match="revoked"):
            trace(remote_model)
        assert nnsight.whoami() == {"email": None, "tags": []}
    context.close()

    # Neither the key nor the password is in the server's database in clear.
    database = b"".join(p.read_bytes() for p in sorted(server.data_dir.glob("nnhost.sqlite3*")))
    assert database and key.encode() not in database and PASSWORD.encode() not in database
    assert sorted(p.name for p in SHOTS.glob("*.png")) == [
        "01-signup.png", "02-keys-after-signup.png", "03-login.png",
        "04-login-wrong-password.png", "05-key-created-and-copied.png", "06-jobs.png",
        "07-job.png", "08-key-revoked.png",
    ]


def test_pages_refuse_framing_and_inline_script(server):
    page = httpx.get(f"{server.url}/login")
    assert page.headers["x-frame-options"] == "DENY"
    policy = page.headers["content-security-policy"]
    assert "script-src 'self'" in policy and "frame-ancestors 'none'" in policy
    assert page.headers["cache-control"] == "no-store"
    assert httpx.get(f"{server.url}/static/app.js").status_code == 200

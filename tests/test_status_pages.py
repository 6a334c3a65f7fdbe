"""The public status page and the operator page, in a real browser, while jobs run.

A server of this module's own (its model is evicted and redeployed here, which
the session server's other users must not see) serves a user's sleeping jobs.
The status page, loaded once, must follow them by itself (no reload): the
queue and running counts it shows (and a model that cannot load, shown UNHEALTHY) are those of ``/api/overview`` and of the
client's ``/status`` at the same moment, and its chart and medians match the
API once they end. The operator, logged in on the web, sees the jobs with
their owner, cancels one with its button, finds it among the recent errors,
evicts the model and deploys it again, while the status page follows each
level and state. Screenshots go to the test's temporary directory.
"""

from __future__ import annotations

import time

import httpx
import pytest
from conftest import API_KEY, TEST_REPO
from test_accounts import as_client, make_user
from test_browser import Camera, browser  # noqa: F401  (the browser fixture)

from nnhost.testing import ServerProcess

PROMPT = "The Eiffel Tower is in the city of"
OPERATOR, OPERATOR_PASSWORD = "ops@example.org", "an operator's long password"
USER = "ada@example.org"
#: Each job sleeps this long: long enough for two page refreshes while it runs.
SLEEP = 5.0
ROW = f"tr[data-model='{TEST_REPO}']"


BROKEN = "nnhost-test/broken-gpt2"


def build_broken(hf_home) -> None:
    """A model whose weights file has a good header and half its data: it cannot load."""
    from nnhost.models.tiny import build_tiny_gpt2

    weights = build_tiny_gpt2(BROKEN, hf_home=hf_home) / "model.safetensors"
    data = weights.read_bytes()
    weights.unlink()  # a link into the cache's blobs: replace it, leave the blob alone
    weights.write_bytes(data[: len(data) // 2])


@pytest.fixture(scope="module")
def watched(root, server_hf_home, test_snapshot, server):
    build_broken(server_hf_home)
    process = ServerProcess(
        [TEST_REPO, BROKEN], data_dir=root / "watched-data", hf_home=server_hf_home,
        # One job at a time: the page shows the jobs behind a running one as queued.
        api_key=API_KEY, extra_args=["--time-limit", "30", "--jobs-at-once", "1"],
    )
    process.start()
    yield process
    process.stop()


@pytest.fixture(scope="module")
def user_key(watched) -> str:
    return make_user(watched, USER)


@pytest.fixture(scope="module")
def operator(watched) -> str:
    make_user(watched, OPERATOR, "admin", password=OPERATOR_PASSWORD)
    return OPERATOR


def submit_sleeping(model, server, key: str) -> str:
    with as_client(server, key):
        with model.trace(PROMPT, remote=True, blocking=False) as tracer:
            time.sleep(SLEEP)
            model.lm_head.output[:, -1].save()
    return tracer.backend.job_id


def job_status(server, key: str, job_id: str) -> dict:
    return httpx.get(f"{server.url}/response/{job_id}", headers={"ndif-api-key": key}).json()


def wait_final(server, key: str, job_ids, timeout: float = 60) -> list[dict]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        latest = [job_status(server, key, job_id) for job_id in job_ids]
        if all(entry["status"] in ("COMPLETED", "ERROR") for entry in latest):
            return latest
        time.sleep(0.2)
    raise AssertionError(f"jobs did not finish: {latest}")


def overview_of(server) -> dict:
    data = httpx.get(f"{server.url}/api/overview").json()
    return next(model for model in data["models"] if model["name"] == TEST_REPO)


def shown(page, field: str) -> str:
    return page.locator(f"{ROW} [data-field={field}]").inner_text().strip()


def wait_shown(page, field: str, text: str, timeout: float = 30_000) -> None:
    page.wait_for_function(
        """([row, field, text]) => {
            const cell = document.querySelector(`${row} [data-field="${field}"]`);
            return cell && cell.textContent.trim() === text;
        }""",
        arg=[ROW, field, text], timeout=timeout,
    )


def wait_value(page, field: str, value: str, timeout: float = 30_000) -> None:
    page.wait_for_function(
        """([row, field, value]) => {
            const cell = document.querySelector(`${row} [data-field="${field}"]`);
            return cell && cell.dataset.value === value;
        }""",
        arg=[ROW, field, value], timeout=timeout,
    )


def test_status_page_follows_jobs_without_a_reload(watched, browser, remote_model, user_key, tmp_path):  # noqa: F811
    shot = Camera(tmp_path)
    context = browser.new_context(base_url=watched.url, viewport={"width": 1200, "height": 800})
    page = context.new_page()
    page.goto("/")
    # Anyone may look; sign-up and login stay one click away.
    assert page.locator("nav >> text=Log in").count() == 1
    assert page.locator("nav >> text=Sign up").count() == 1
    page.evaluate("window.loadedOnce = true")
    api, client = overview_of(watched), watched.status()["deployments"][TEST_REPO]
    assert shown(page, "level") == api["level"] == client["deployment_level"] == "HOT"
    assert shown(page, "state") == api["state"] == client["application_state"] == "RUNNING"
    assert shown(page, "replicas") == "1/1"
    assert api["containment"] and api["containment"]["active"]
    assert shown(page, "containment").startswith(", ".join(api["containment"]["active"]))
    # A model that cannot load is shown as such, and the service as degraded.
    broken = next(m for m in httpx.get(f"{watched.url}/api/overview").json()["models"]
                  if m["name"] == BROKEN)
    assert broken["state"] == "UNHEALTHY" == watched.status()["deployments"][BROKEN]["application_state"]
    assert page.locator(f"tr[data-model='{BROKEN}'] [data-field=state]").inner_text() == "UNHEALTHY"
    assert page.inner_text("[data-testid=service-state]") == "degraded"
    shot(page, "status-idle")

    jobs = [submit_sleeping(remote_model, watched, user_key) for _ in range(3)]
    # One runs, two wait: the page shows it by itself, as the API and /status do.
    wait_value(page, "running", "1")
    wait_value(page, "queued", "2")
    api, client = overview_of(watched), watched.status()["deployments"][TEST_REPO]
    assert (api["running"], api["queued"], client["queued"]) == (1, 2, 2)
    assert page.evaluate("window.loadedOnce") is True  # updated in place, never reloaded
    shot(page, "status-busy")

    finals = wait_final(watched, user_key, jobs)
    assert [entry["status"] for entry in finals] == ["COMPLETED"] * 3
    wait_value(page, "queued", "0")
    wait_value(page, "running", "0")
    # The medians and the chart, once the page has refreshed after the last job.
    api_data = httpx.get(f"{watched.url}/api/overview").json()
    ended = sum(b["completed"] for b in api_data["per_minute"])
    assert ended >= 3
    page.wait_for_function(
        "(n) => [...document.querySelectorAll('svg.chart g[data-minute]')]"
        ".reduce((sum, g) => sum + Number(g.dataset.completed), 0) === n",
        arg=ended, timeout=15_000,
    )
    api = overview_of(watched)
    assert api["median_run_seconds"] >= SLEEP and api["median_wait_seconds"] >= 0
    wait_value(page, "median_run_seconds", str(api["median_run_seconds"]))
    assert float(page.locator(f"{ROW} [data-field=median_wait_seconds]").get_attribute("data-value")) \
        == pytest.approx(api["median_wait_seconds"])
    assert shown(page, "median_run_seconds").endswith(" s")
    assert page.evaluate("window.loadedOnce") is True
    shot(page, "status-after")
    context.close()


def log_in(page, email: str, password: str) -> None:
    page.goto("/login")
    page.fill("input[name=email]", email)
    page.fill("input[name=password]", password)
    page.click("button[type=submit]:has-text('Log in')")
    page.wait_for_url("**/keys")


def test_operator_cancels_evicts_and_deploys(watched, browser, remote_model, user_key, operator, tmp_path):  # noqa: F811
    shot = Camera(tmp_path)
    context = browser.new_context(base_url=watched.url, viewport={"width": 1200, "height": 900})
    admin = context.new_page()
    log_in(admin, operator, OPERATOR_PASSWORD)
    public = browser.new_context(base_url=watched.url).new_page()
    public.goto("/")
    public.evaluate("window.loadedOnce = true")

    running, waiting = (submit_sleeping(remote_model, watched, user_key) for _ in range(2))
    wait_value(public, "queued", "1")
    admin.click("nav >> text=Operator")
    admin.wait_for_url("**/admin")
    listed = httpx.get(f"{watched.url}/admin/jobs", headers={"ndif-api-key": API_KEY}).json()["jobs"]
    for job_id in (running, waiting):
        row = admin.locator(f"[data-testid=live-jobs] tr[data-job-id='{job_id}']")
        assert row.locator("[data-field=owner]").inner_text() == USER
        entry = next(job for job in listed if job["id"] == job_id)
        assert row.locator("[data-field=status]").inner_text() == entry["status"]
        assert TEST_REPO in row.inner_text()
    assert admin.locator(f"[data-testid=live-jobs] tr[data-job-id='{running}'] [data-field=status]") \
        .inner_text() in ("DISPATCHED", "RUNNING")
    shot(admin, "admin-busy")

    # Cancel the waiting job from the page: the user's client is told, and it is an error here.
    admin.click(f"button[data-cancel='{waiting}']")
    admin.wait_for_url("**/admin?did=cancel*")
    assert waiting in admin.inner_text("[data-testid=notice]")
    cancelled = job_status(watched, user_key, waiting)
    assert cancelled["status"] == "ERROR" and "cancelled" in cancelled["description"]
    assert admin.locator(f"[data-testid=errors] tr[data-job-id='{waiting}']").count() == 1
    assert admin.locator(f"[data-testid=live-jobs] tr[data-job-id='{waiting}']").count() == 0
    shot(admin, "admin-cancelled")
    # A model with work is not evicted: the page says why.
    admin.click(f"tr[data-model='{TEST_REPO}'] button[data-action=evict]")
    assert "queued or running" in admin.inner_text("main")
    assert wait_final(watched, user_key, [running])[0]["status"] == "COMPLETED"

    # Evict: the public page shows it COLD by itself; deploy: DEPLOYING, then HOT and RUNNING.
    admin.goto("/admin")
    admin.click(f"tr[data-model='{TEST_REPO}'] button[data-action=evict]")
    admin.wait_for_url("**/admin?did=evict*")
    wait_shown(public, "level", "COLD")
    wait_shown(public, "state", "NOT_STARTED")
    client = watched.status()["deployments"][TEST_REPO]
    assert client["deployment_level"] == "COLD" and overview_of(watched)["level"] == "COLD"
    shot(public, "status-evicted")
    admin.click(f"tr[data-model='{TEST_REPO}'] button[data-action=hot]")
    admin.wait_for_url("**/admin?did=hot*")
    coming = overview_of(watched)
    assert (coming["target"], coming["state"]) in (("HOT", "DEPLOYING"), ("HOT", "RUNNING"))
    wait_shown(public, "level", "HOT")
    wait_shown(public, "state", "RUNNING")
    assert overview_of(watched)["state"] == "RUNNING"
    assert public.evaluate("window.loadedOnce") is True
    shot(public, "status-redeployed")
    shot(admin, "admin-after")
    context.close()


def test_operator_page_is_for_operators(watched, browser, user_key):  # noqa: F811
    make_user(watched, "bob@example.org", password="bob's long password")
    context = browser.new_context(base_url=watched.url)
    page = context.new_page()
    response = page.goto("/admin")
    assert page.url.endswith("/login?next=/admin")
    log_in(page, "bob@example.org", "bob's long password")
    assert page.locator("nav >> text=Operator").count() == 0
    response = page.goto("/admin")
    assert response.status == 403 and "Operators only" in page.inner_text("main")
    context.close()
    # And the buttons' routes refuse a form without a session just the same.
    refused = httpx.post(f"{watched.url}/admin/models/{TEST_REPO}/evict", follow_redirects=False)
    assert refused.status_code == 303 and "/login" in refused.headers["location"]
    assert overview_of(watched)["level"] == "HOT"


def test_a_model_that_cannot_load_says_why_in_the_servers_log(watched):
    """An operator reading the log sees why, not only a model that never becomes ready."""
    assert watched.status()["deployments"][BROKEN]["application_state"] == "UNHEALTHY"
    log = watched.log_path.read_text(errors="replace")
    line = next((line for line in log.splitlines() if f"a replica of {BROKEN} is unhealthy" in line), None)
    assert line is not None, log[-3000:]
    assert "ERROR" in line
    assert "Traceback" in log[log.index(line):]

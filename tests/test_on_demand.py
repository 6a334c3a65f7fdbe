"""Models on demand: an allowed model nobody listed is fetched from the upstream Hub and served.

Two real servers on loopback: the *upstream* hosts tiny GPT-2s and, with
``hub_serve_weights``, serves their weights through its Hub mirror, as the
Hugging Face Hub would; the *downstream* lists no model at all, only an
``[[allow]]`` entry for ``nnhost-up/tiny-*`` and a disk budget, and its
``HF_ENDPOINT`` names the upstream. The real nnsight client (in a fresh
interpreter, its ``HF_ENDPOINT`` at the upstream too, as a user's laptop at
the real Hub would be) runs a program on a model the downstream has never
seen, and the result must equal the same program run locally. The upstream's
access log tells what was downloaded: each model's weights once, and never
those of a model refused for its size.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
import torch
from compare import assert_identical
from conftest import API_KEY

from nnhost.testing import ServerProcess
from nnhost.units import format_size

TESTS = Path(__file__).resolve().parent
ALLOWED = ["nnhost-up/tiny-a", "nnhost-up/tiny-b", "nnhost-up/tiny-c"]
BIG = "nnhost-up/tiny-big"
#: Its safetensors file is longer than its header says: the upstream's listing and the file disagree.
PADDED = "nnhost-up/tiny-padded"
MAX_SIZE = 4 * 1024 * 1024


def _key(repo: str, task: str = "text-generation") -> str:
    return 'nnsight.modeling.transformers.TransformersModel:' + json.dumps(
        {"repo_id": repo, "revision": None, "task": task}
    )


@pytest.fixture(scope="module")
def upstream_home(root):
    from nnhost.models.tiny import TinyGPT2Spec, build_tiny_gpt2

    home = root / "upstream-hf"
    snapshots = {repo: build_tiny_gpt2(repo, home, TinyGPT2Spec(seed=i + 1)) for i, repo in enumerate(ALLOWED)}
    # Four times as wide: about 13 MB of float32 weights, over the allowed 4 MB.
    snapshots[BIG] = build_tiny_gpt2(BIG, home, TinyGPT2Spec(n_embd=256, n_layer=4))
    snapshots[PADDED] = build_tiny_gpt2(PADDED, home, TinyGPT2Spec(seed=9))
    weights = snapshots[PADDED] / "model.safetensors"
    weights.write_bytes(weights.read_bytes() + b"\0" * 4096)
    # The repository's own code, which a downstream never fetches unless its entry allows it.
    (snapshots[ALLOWED[1]] / "modeling_custom.py").write_text("raise SystemExit('ran the repo code')\n")
    return home, snapshots


@pytest.fixture(scope="module")
def upstream(root, upstream_home):
    home, _ = upstream_home
    data = root / "upstream-data"
    data.mkdir(parents=True, exist_ok=True)
    lines = ["hub_serve_weights = true", "spare_hosts = 0", ""]
    for index, repo in enumerate([*ALLOWED, BIG, PADDED]):
        lines += ["[[model]]", f'repo_id = "{repo}"', f'deploy = "{"hot" if index == 0 else "cold"}"', ""]
    (data / "nnhost.toml").write_text("\n".join(lines))
    # At info the access log names every file the downstream asks for.
    process = ServerProcess([], data_dir=data, hf_home=home, api_key=API_KEY,
                            extra_args=["--log-level", "info"])
    process.start()
    yield process
    process.stop()


def _disk(snapshot: Path) -> int:
    return sum(p.stat().st_size for p in snapshot.rglob("*") if p.is_file())


@pytest.fixture(scope="module")
def downstream(root, upstream, upstream_home):
    _, snapshots = upstream_home
    data = root / "downstream-data"
    data.mkdir(parents=True, exist_ok=True)
    # Room for two of the tiny models on disk, not three.
    budget = int(2.5 * max(_disk(snapshots[repo]) for repo in ALLOWED))
    (data / "nnhost.toml").write_text(textwrap.dedent(f"""\
        spare_hosts = 0
        download_budget = {budget}
        time_limit = 120

        [limits.default]
        requests_per_minute = 0
        queued_jobs = 0

        [[allow]]
        repo_id = "nnhost-up/tiny-*"
        max_size = "{MAX_SIZE}"
        dtype = "float32"
        """))
    process = ServerProcess([], data_dir=data, hf_home=root / "downstream-hf", api_key=API_KEY,
                            env={"HF_ENDPOINT": f"{upstream.url}/hub", "HF_HUB_OFFLINE": "0"})
    process.start()
    yield process
    process.stop()


# -- helpers -------------------------------------------------------------------------


_CLIENT = """
import sys, warnings
warnings.simplefilter("ignore")
import torch
from nnsight import LanguageModel
import on_demand_programs
model = LanguageModel(sys.argv[1])
torch.save(on_demand_programs.read_and_patch(model, True), sys.argv[2])
"""


def _client(downstream, upstream, repo: str, work: Path) -> subprocess.Popen:
    """A user's client: its meta model from the upstream Hub, its jobs to the downstream."""
    work.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ)
    for name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_HUB_CACHE", "HF_TOKEN", "NNSIGHT_DEBUG"):
        env.pop(name, None)
    env.update(
        NDIF_HOST=downstream.url, NDIF_API_KEY=API_KEY, HF_ENDPOINT=f"{upstream.url}/hub",
        HF_HOME=str(work / "hf"), HF_HUB_DISABLE_PROGRESS_BARS="1",
        NNSIGHT_CONFIG=str(work / "nnsight.yaml"), TOKENIZERS_PARALLELISM="false",
        PYTHONPATH=os.pathsep.join([str(TESTS), env.get("PYTHONPATH", "")]),
    )
    return subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(_CLIENT), repo, str(work / "out.pt")],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )


def _finish(process: subprocess.Popen, work: Path) -> tuple[dict, list[str]]:
    """The client's saved values and the status lines it printed."""
    out, err = process.communicate(timeout=600)
    if process.returncode != 0:
        raise AssertionError(f"client failed ({process.returncode}):\n{out[-3000:]}\n{err[-6000:]}")
    lines = [re.sub(r"\x1b\[[0-9;]*[A-Za-z]", "", part).strip() for part in out.split("\r")]
    return torch.load(work / "out.pt", weights_only=False), [line for line in lines if line]


def _post(server, repo: str, task: str = "text-generation") -> httpx.Response:
    return httpx.post(
        f"{server.url}/request",
        data={"data": json.dumps({"model_key": _key(repo, task)})},
        files={"blob": ("request", b"not a trace", "application/octet-stream")},
        headers={"ndif-api-key": API_KEY, "nnsight-version": "0.8.1"},
        timeout=60,
    )


def _final(server, job_id: str) -> dict:
    """The job's response once it has ended (a wait for the server, never a timed assert)."""
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        body = httpx.get(f"{server.url}/response/{job_id}", headers={"ndif-api-key": API_KEY},
                         timeout=30).json()
        if body["status"] in ("COMPLETED", "ERROR"):
            return body
        time.sleep(0.3)
    raise TimeoutError(f"job {job_id} did not end")


def _fetch(server, repo: str) -> dict:
    response = _post(server, repo)
    assert response.status_code == 200, response.text
    return _final(server, response.json()["id"])


def _weight_gets(upstream, repo: str, code: int) -> int:
    """How many times the upstream answered ``code`` to a GET of ``repo``'s weights."""
    pattern = re.compile(rf'"GET /hub/{re.escape(repo)}/resolve/[0-9a-f]{{40}}/model\.safetensors HTTP/1\.1" {code}')
    return sum(1 for line in upstream.log_path.read_text(errors="replace").splitlines() if pattern.search(line))


def _cached(downstream, repo: str) -> bool:
    return (downstream.hf_home / "hub" / ("models--" + repo.replace("/", "--"))).exists()


# -- the tests -------------------------------------------------------------------------


def test_not_allowed_is_404_naming_what_is(downstream):
    response = _post(downstream, "someone-else/model")
    assert response.status_code == 404
    detail = response.json()["detail"]
    assert "does not serve someone-else/model" in detail and "[[allow]]" in detail
    assert f"nnhost-up/tiny-* (up to {format_size(MAX_SIZE)})" in detail


def test_allowed_model_is_fetched_shown_and_equals_local(downstream, upstream, upstream_home, tmp_path):
    from nnsight import TransformersModel

    repo = ALLOWED[0]
    assert not _cached(downstream, repo)
    remote, lines = _finish(_client(downstream, upstream, repo, tmp_path), tmp_path)
    local_model = TransformersModel(str(upstream_home[1][repo]), task="text-generation", dispatch=True)
    assert_identical(remote, read_and_patch_local(local_model))
    # The job waited QUEUED while the download went on, and said how far it was.
    progress = [line for line in lines if f"Downloading {repo}:" in line]
    assert progress and all("QUEUED" in line for line in progress), lines
    assert any(" 0% of " in line for line in progress) and any(" 100% of " in line for line in progress)
    # Sized from the header (ranged reads) first, then the weights fetched once.
    assert _weight_gets(upstream, repo, 206) >= 2
    assert _weight_gets(upstream, repo, 200) == 1
    assert _cached(downstream, repo)


def read_and_patch_local(model):
    import on_demand_programs

    for parameter in model._module.parameters():
        parameter.requires_grad_(False)
    return on_demand_programs.read_and_patch(model, False)


def test_two_requests_at_once_download_once(downstream, upstream):
    repo = ALLOWED[1]
    with ThreadPoolExecutor(2) as pool:
        responses = list(pool.map(lambda _: _post(downstream, repo), range(2)))
    assert [r.status_code for r in responses] == [200, 200], [r.text for r in responses]
    for response in responses:
        # Not a real trace: it ends in ERROR once it reaches the fetched model.
        assert _final(downstream, response.json()["id"])["status"] == "ERROR"
    assert _weight_gets(upstream, repo, 200) == 1
    snapshot = next((downstream.hf_home / "hub" / ("models--" + repo.replace("/", "--")) / "snapshots").iterdir())
    listed = httpx.get(f"{upstream.url}/hub/api/models/{repo}", timeout=30).json()["siblings"]
    assert "modeling_custom.py" in {sibling["rfilename"] for sibling in listed}  # offered, not taken
    assert (snapshot / "config.json").is_file() and not list(snapshot.glob("*.py"))
    status = httpx.get(f"{downstream.url}/status", timeout=30).json()
    assert repo in status["deployments"]


def test_model_over_max_size_is_refused_before_download(downstream, upstream):
    body = _fetch(downstream, BIG)
    assert body["status"] == "ERROR"
    assert "too large" in body["description"] and f"up to {format_size(MAX_SIZE)}" in body["description"]
    assert _weight_gets(upstream, BIG, 206) >= 1  # its header was read
    assert _weight_gets(upstream, BIG, 200) == 0  # its weights never were
    assert not _cached(downstream, BIG)


def test_file_longer_than_its_header_says_is_refused_before_download(downstream, upstream):
    body = _fetch(downstream, PADDED)
    assert body["status"] == "ERROR"
    assert "model.safetensors is listed as" in body["description"] and "its header describes" in body["description"]
    assert _weight_gets(upstream, PADDED, 200) == 0
    assert not _cached(downstream, PADDED)


def test_disk_budget_deletes_least_recently_used(downstream):
    a, b, c = ALLOWED
    for repo in (a, b):  # fetched now or before; used in this order either way
        _fetch(downstream, repo)
    assert _cached(downstream, a) and _cached(downstream, b)
    _fetch(downstream, c)
    assert not _cached(downstream, a), "the least recently used model was kept"
    assert _cached(downstream, b) and _cached(downstream, c)
    status = httpx.get(f"{downstream.url}/status", timeout=30).json()
    assert a not in status["deployments"] and c in status["deployments"]


def test_a_fetched_model_is_not_taken_on_again_as_another_task(downstream):
    repo = ALLOWED[1]
    _fetch(downstream, repo)
    response = _post(downstream, repo, task="fill-mask")
    assert response.status_code == 404
    assert f"does not serve {repo} (fill-mask)" in response.json()["detail"]
    assert f"{repo} (text-generation)" in response.json()["detail"]


def test_after_a_restart_a_fetched_model_is_served_from_disk(downstream, upstream):
    repo = ALLOWED[1]
    _fetch(downstream, repo)  # on disk (fetched by an earlier test or now)
    before = _weight_gets(upstream, repo, 200)
    downstream.stop()
    downstream.start()
    assert repo not in httpx.get(f"{downstream.url}/status", timeout=30).json()["deployments"]
    body = _fetch(downstream, repo)
    assert "Hub" not in body["description"], body["description"]
    assert repo in httpx.get(f"{downstream.url}/status", timeout=30).json()["deployments"]
    assert _weight_gets(upstream, repo, 200) == before  # taken from disk, not downloaded again


# -- the setting -------------------------------------------------------------------------


@pytest.mark.parametrize("table, words", [
    ('repo_id = "org/*"', "needs a max_size"),
    ('repo_id = "org/*"\nmax_size = "lots"', "lots"),
    ('repo_id = "org/*"\nmax_size = "1GB"\nsize = 3', "[[allow]] 'org/*': unknown key 'size'"),
    ('max_size = "1GB"', "needs a repo_id"),
    ('repo_id = "org/*"\nmax_size = "1GB"\ndtype = "nf4"', "write quantization"),
])
def test_a_bad_allow_entry_stops_the_settings(tmp_path, monkeypatch, table, words):
    from nnhost.config import SettingsError, load_settings

    for name in [name for name in os.environ if name.upper().startswith("NNHOST_")]:
        monkeypatch.delenv(name)
    (tmp_path / "nnhost.toml").write_text(f"[[allow]]\n{table}\n")
    with pytest.raises(SettingsError, match=re.escape(words)):
        load_settings({"data_dir": str(tmp_path)})


def test_allow_entries_and_budget_load_and_match(tmp_path, monkeypatch):
    from nnhost.app import build_catalog
    from nnhost.config import load_settings
    from nnhost.models.catalog import ModelKey

    for name in [name for name in os.environ if name.upper().startswith("NNHOST_")]:
        monkeypatch.delenv(name)
    (tmp_path / "nnhost.toml").write_text(textwrap.dedent("""\
        download_budget = "2GiB"
        [[allow]]
        repo_id = "org/*"
        max_size = "1.5GB"
        dtype = "bfloat16"
        """))
    settings = load_settings({"data_dir": str(tmp_path)})
    assert settings.download_budget == 2 * 1024**3
    catalog = build_catalog(settings)
    (rule,) = catalog.allowed
    assert rule.max_size == 1_500_000_000
    key = ModelKey.parse(_key("org/model"))
    assert catalog.allowance(key) is rule
    assert catalog.allowance(ModelKey.parse(_key("other/model"))) is None
    asks_for_code = ModelKey(key.model_class, "org/model", trust_remote_code=True)
    assert catalog.allowance(asks_for_code) is None  # the entry does not permit the repo's code
    spec = rule.spec(key)
    assert (spec.repo_id, spec.dtype, spec.deploy, spec.task) == ("org/model", "bfloat16", "cold", "text-generation")


@pytest.mark.parametrize("name, plain", [
    ("config.json", True), ("unet/model.safetensors", True),
    ("../escape", False), ("a/../../b", False), ("/etc/passwd", False), ("a\\b", False),
    (".gitattributes", False), ("a//b", False), ("", False), (None, False), ("x\0y", False),
])
def test_only_plain_file_names_from_the_upstream_are_written(name, plain):
    from nnhost.models.downloader import plain_path

    assert (plain_path(name) is not None) is plain

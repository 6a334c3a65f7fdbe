"""The read-only Hub mirror (`nnhost.api.hub`), against the real client libraries.

A tiny GPT-2 is built into a private HF cache; a uvicorn server on 127.0.0.1
mounts the mirror twice: under ``/hub`` (weights hidden, the default) and under
``/hubw`` (weights served). Client code runs in subprocesses, so that
`huggingface_hub` reads ``HF_ENDPOINT``/``HF_HOME`` fresh and starts with an
empty cache: whatever it gets, it got from the mirror.
"""

from __future__ import annotations

import hashlib
import http.client
import json
import os
import socket
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import httpx
import pytest
import uvicorn
from fastapi import FastAPI, Request

from nnhost.api.hub import create_hub_router
from nnhost.models.hfcache import find_snapshot, install_snapshot
from nnhost.models.tiny import build_tiny_gpt2

REPO = "nnhost-test/mirror-gpt2"
EXTRA = "nnhost-test/odd-files"  # hosted: a subfolder and a symlink pointing out
UNHOSTED = "nnhost-test/not-hosted"  # in the cache, but not in the hosted set
BLOBS = "nnhost-test/blob-layout"  # as huggingface_hub caches: symlinks into blobs/
BLOBS_COMMIT = "1234567890abcdef1234567890abcdef12345678"
SECRET = b"this must never leave the server"


class _Server:
    """uvicorn in a background thread, on a socket bound to a free port."""

    def __init__(self, app: FastAPI) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        config = uvicorn.Config(app, log_level="warning", lifespan="off")
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(
            target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True
        )

    def __enter__(self) -> "_Server":
        self.thread.start()
        for _ in range(200):
            if self.server.started:
                return self
            if not self.thread.is_alive():
                break
            self.thread.join(0.05)
        raise RuntimeError("the test server did not start")

    def __exit__(self, *exc) -> None:
        self.server.should_exit = True
        self.thread.join(10)
        self.sock.close()
        assert not self.thread.is_alive(), "the test server did not stop"


@pytest.fixture(scope="module")
def hosted(tmp_path_factory):
    """The server's HF home with the hosted repos, and the served mirror."""
    home = tmp_path_factory.mktemp("server_hf_home")
    snapshot = build_tiny_gpt2(REPO, hf_home=home)

    # A second hosted repo with a subfolder and a symlink to a file outside
    # the snapshot; and a repo present in the cache that is not hosted.
    (home / "secret.txt").write_bytes(SECRET)
    extra_src = tmp_path_factory.mktemp("extra_src")
    (extra_src / "config.json").write_text('{"model_type": "gpt2"}')
    (extra_src / "sub" / "dir").mkdir(parents=True)
    (extra_src / "sub" / "dir" / "notes.txt").write_text("nested")
    extra = install_snapshot(extra_src, EXTRA, hf_home=home)
    (extra / "leak.json").symlink_to(home / "secret.txt")
    (extra / "linked_dir").symlink_to(home, target_is_directory=True)
    unhosted = install_snapshot(snapshot, UNHOSTED, hf_home=home)
    _cache_layout_repo(home, snapshot, unhosted)

    hosted_ids = {REPO, EXTRA, BLOBS}

    def resolve(repo_id, revision):
        if repo_id not in hosted_ids:
            return None
        return find_snapshot(repo_id, revision, hf_home=home)

    requests: list[tuple[str, str, int]] = []
    app = FastAPI()

    @app.middleware("http")
    async def record(request: Request, call_next):
        response = await call_next(request)
        requests.append((request.method, request.url.path, response.status_code))
        return response

    app.include_router(create_hub_router(resolve), prefix="/hub")
    app.include_router(create_hub_router(resolve, serve_weights=True), prefix="/hubw")

    with _Server(app) as server:
        base = f"http://127.0.0.1:{server.port}"
        yield {
            "home": home,
            "snapshot": snapshot,
            "sha": snapshot.name,
            "base": base,
            "requests": requests,
        }


def _cache_layout_repo(home: Path, source: Path, unhosted: Path) -> None:
    """``BLOBS`` laid out as a download fills the cache: files are links to blobs."""
    repo = home / "hub" / ("models--" + BLOBS.replace("/", "--"))
    snap = repo / "snapshots" / BLOBS_COMMIT
    (repo / "blobs").mkdir(parents=True)
    snap.mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(BLOBS_COMMIT)
    for name in ("config.json", "model.safetensors"):
        data = (source / name).read_bytes()
        blob = hashlib.sha256(data).hexdigest() if name.endswith(".safetensors") else _git_blob_id(data)
        (repo / "blobs" / blob).write_bytes(data)
        (snap / name).symlink_to(Path("..") / ".." / "blobs" / blob)
    # A link into another (unhosted) repo of the same cache must not be followed.
    (snap / "tokenizer.json").symlink_to(unhosted / "tokenizer.json")


def _client_env(endpoint: str, hf_home: Path) -> dict:
    env = dict(os.environ)
    for name in (
        "HF_HUB_OFFLINE",
        "TRANSFORMERS_OFFLINE",
        "HF_HUB_CACHE",
        "HUGGINGFACE_HUB_CACHE",
        "TRANSFORMERS_CACHE",
        "HF_TOKEN",
        "HUGGING_FACE_HUB_TOKEN",
    ):
        env.pop(name, None)
    env.update(
        HF_ENDPOINT=endpoint,
        HF_HOME=str(hf_home),
        HF_HUB_DISABLE_TELEMETRY="1",
        HF_HUB_DISABLE_PROGRESS_BARS="1",
        NO_PROXY="127.0.0.1,localhost",
        no_proxy="127.0.0.1,localhost",
        PYTHONWARNINGS="ignore",
    )
    return env


def _run_client(code: str, endpoint: str, hf_home: Path, *args: str) -> dict:
    """Run ``code`` in a fresh interpreter; it prints ``RESULT <json>`` last."""
    hf_home.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code), *args],
        env=_client_env(endpoint, hf_home),
        capture_output=True,
        text=True,
        timeout=120,
    )
    lines = [l for l in done.stdout.splitlines() if l.startswith("RESULT ")]
    assert done.returncode == 0 and lines, f"client failed:\n{done.stdout}\n{done.stderr}"
    return json.loads(lines[-1][len("RESULT ") :])


def _raw_get(base: str, path: str) -> tuple[int, dict, bytes]:
    """A GET with the path sent exactly as written (no client-side normalising)."""
    host, port = base.rsplit("/", 1)[-1].split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=10)
    try:
        conn.request("GET", path)
        response = conn.getresponse()
        return response.status, dict(response.getheaders()), response.read()
    finally:
        conn.close()


def _git_blob_id(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


# --------------------------------------------------------------------------
# The unmodified nnsight client
# --------------------------------------------------------------------------


def test_nnsight_builds_meta_model_and_key_through_mirror(hosted, tmp_path):
    before = len(hosted["requests"])
    result = _run_client(
        """
        import json
        import nnsight.modeling.huggingface as h
        assert "nnhost-test/mirror-gpt2" not in h._ID_CACHE
        from nnsight import LanguageModel
        m = LanguageModel("nnhost-test/mirror-gpt2")
        key = m.to_model_key()
        ids = m.tokenizer("hello")["input_ids"]
        print("RESULT " + json.dumps({"key": key, "ids": ids, "cached": h._ID_CACHE}))
        """,
        hosted["base"] + "/hub",
        tmp_path / "client_home",
    )
    prefix, _, payload = result["key"].partition(":")
    assert prefix.startswith("nnsight.")
    data = json.loads(payload)
    assert data["repo_id"] == REPO
    assert data.get("task") == "text-generation"
    assert result["cached"][REPO] == REPO
    assert isinstance(result["ids"], list) and result["ids"]

    seen = hosted["requests"][before:]
    assert any(path == f"/hub/api/models/{REPO}" for _, path, _ in seen)
    assert any(path.endswith("/config.json") and status == 200 for _, path, status in seen)
    assert all(status < 500 for _, _, status in seen), seen
    assert not any(path.endswith(".safetensors") for _, path, _ in seen), seen


# --------------------------------------------------------------------------
# huggingface_hub and transformers
# --------------------------------------------------------------------------


def test_huggingface_hub_api_and_download(hosted, tmp_path):
    result = _run_client(
        """
        import json, os
        from huggingface_hub import HfApi, hf_hub_download
        from huggingface_hub.errors import (
            EntryNotFoundError, RepositoryNotFoundError, RevisionNotFoundError,
        )
        api = HfApi(endpoint=os.environ["HF_ENDPOINT"])
        repo = "nnhost-test/mirror-gpt2"
        info = api.model_info(repo)
        at_sha = api.model_info(repo, revision=info.sha)
        with_blobs = api.model_info(repo, files_metadata=True)
        tree = [(type(f).__name__, f.path) for f in api.list_repo_tree(repo, recursive=True)]
        config = hf_hub_download(repo, "config.json")
        config_again = hf_hub_download(repo, "config.json", revision=info.sha)

        def error_of(call):
            try:
                call()
            except Exception as e:
                return type(e).__name__ + ("/EntryNotFound" if isinstance(e, EntryNotFoundError) else "")
            return None

        print("RESULT " + json.dumps({
            "id": info.id, "sha": info.sha, "sha_at_sha": at_sha.sha,
            "pipeline_tag": info.pipeline_tag, "library_name": info.library_name,
            "siblings": [s.rfilename for s in info.siblings],
            "sizes": {s.rfilename: s.size for s in with_blobs.siblings},
            "safetensors_total": info.safetensors.total if info.safetensors else None,
            "tree": tree, "config": config, "config_again": config_again,
            "unknown_repo": error_of(lambda: api.model_info("nobody/nothing")),
            "unhosted_repo": error_of(lambda: api.model_info("nnhost-test/not-hosted")),
            "unknown_rev": error_of(lambda: api.model_info(repo, revision="0" * 40)),
            "pr_rev": error_of(lambda: api.model_info(repo, revision="refs/pr/1")),
            "missing_file": error_of(lambda: hf_hub_download(repo, "nope.json")),
            "weights": error_of(lambda: hf_hub_download(repo, "model.safetensors")),
        }))
        """,
        hosted["base"] + "/hub",
        tmp_path / "client_home",
    )
    snapshot = hosted["snapshot"]
    assert result["id"] == REPO
    assert result["sha"] == result["sha_at_sha"] == snapshot.name
    assert result["pipeline_tag"] == "text-generation"
    assert result["library_name"] == "transformers"
    assert "config.json" in result["siblings"] and "tokenizer.json" in result["siblings"]
    assert "model.safetensors" not in result["siblings"]
    assert result["sizes"]["config.json"] == (snapshot / "config.json").stat().st_size
    assert result["safetensors_total"] and result["safetensors_total"] > 0
    assert ("RepoFile", "config.json") in [tuple(t) for t in result["tree"]]
    assert not any(path.endswith(".safetensors") for _, path in result["tree"])

    local = (snapshot / "config.json").read_bytes()
    assert Path(result["config"]).read_bytes() == local
    assert Path(result["config_again"]).read_bytes() == local
    assert f"/snapshots/{snapshot.name}/" in result["config"]

    assert result["unknown_repo"] == "RepositoryNotFoundError"
    assert result["unhosted_repo"] == "RepositoryNotFoundError"
    assert result["unknown_rev"] == "RevisionNotFoundError"
    assert result["pr_rev"] == "RevisionNotFoundError"
    assert result["missing_file"].endswith("/EntryNotFound")
    assert result["weights"].endswith("/EntryNotFound")


def test_transformers_loads_weights_when_served(hosted, tmp_path):
    result = _run_client(
        """
        import json, sys, torch
        from safetensors.torch import load_file
        from transformers import AutoModelForCausalLM
        model = AutoModelForCausalLM.from_pretrained("nnhost-test/mirror-gpt2")
        local = load_file(sys.argv[1])
        state = model.state_dict()
        equal = all(torch.equal(state[name], tensor) for name, tensor in local.items())
        print("RESULT " + json.dumps({"equal": equal, "compared": len(local)}))
        """,
        hosted["base"] + "/hubw",
        tmp_path / "client_home",
        str(hosted["snapshot"] / "model.safetensors"),
    )
    assert result["compared"] > 0 and result["equal"]


# --------------------------------------------------------------------------
# The HTTP surface, directly
# --------------------------------------------------------------------------


def test_model_info_routes(hosted):
    base, sha = hosted["base"], hosted["sha"]
    with httpx.Client(base_url=base, timeout=10) as client:
        for path in (
            f"/hub/api/models/{REPO}",
            f"/hub/api/models/{REPO}/revision/main",
            f"/hub/api/models/{REPO}/revision/{sha}",
        ):
            response = client.get(path)
            assert response.status_code == 200, path
            info = response.json()
            assert info["id"] == info["modelId"] == REPO
            assert info["sha"] == sha
            assert info["private"] is False and info["gated"] is False
            assert info["disabled"] is False
            assert {"rfilename": "config.json"} in info["siblings"]

        served = client.get(f"/hubw/api/models/{REPO}").json()
        assert {"rfilename": "model.safetensors"} in served["siblings"]

        for path in ("/hub/api/models/nobody/nothing", f"/hub/api/models/{UNHOSTED}"):
            response = client.get(path)
            assert response.status_code == 404
            assert response.headers["X-Error-Code"] == "RepoNotFound"
            assert "error" in response.json()

        for revision in ("0" * 40, "refs%2Fpr%2F1", "no-such-branch", "%2E%2E", ".hidden"):
            response = client.get(f"/hub/api/models/{REPO}/revision/{revision}")
            assert response.status_code == 404, revision
            assert response.headers["X-Error-Code"] == "RevisionNotFound", revision


def test_tree_routes(hosted):
    base = hosted["base"]
    with httpx.Client(base_url=base, timeout=10) as client:
        root = client.get(f"/hub/api/models/{REPO}/tree/main").json()
        paths = {entry["path"]: entry for entry in root}
        assert paths["config.json"]["type"] == "file"
        config = (hosted["snapshot"] / "config.json").read_bytes()
        assert paths["config.json"]["size"] == len(config)
        assert paths["config.json"]["oid"] == _git_blob_id(config)
        assert "model.safetensors" not in paths

        weights = {
            e["path"]: e for e in client.get(f"/hubw/api/models/{REPO}/tree/main").json()
        }
        data = (hosted["snapshot"] / "model.safetensors").read_bytes()
        assert weights["model.safetensors"]["lfs"]["oid"] == hashlib.sha256(data).hexdigest()

        top = client.get(f"/hub/api/models/{EXTRA}/tree/main").json()
        assert {"sub"} == {e["path"] for e in top if e["type"] == "directory"}
        assert not any(e["path"] in ("leak.json", "linked_dir") for e in top)
        nested = client.get(
            f"/hub/api/models/{EXTRA}/tree/main/sub", params={"recursive": "true", "expand": "true"}
        ).json()
        assert {(e["type"], e["path"]) for e in nested} == {
            ("directory", "sub/dir"),
            ("file", "sub/dir/notes.txt"),
        }
        assert client.get(f"/hub/api/models/{EXTRA}/tree/main/sub/dir").json()[0]["path"] == (
            "sub/dir/notes.txt"
        )
        assert client.get(f"/hub/api/models/{EXTRA}/tree/main/sub%2Fdir").status_code == 200
        assert client.get(f"/hub/api/models/{REPO}/tree/main/no/such/dir").json() == []
        assert client.get(f"/hub/api/models/{REPO}/tree/main/sub/dir").json() == []

        response = client.get("/hub/api/models/nobody/nothing/tree/main")
        assert response.status_code == 404
        assert response.headers["X-Error-Code"] == "RepoNotFound"
        response = client.get(f"/hub/api/models/{REPO}/tree/{'0' * 40}")
        assert response.headers["X-Error-Code"] == "RevisionNotFound"


def test_resolve_files_and_errors(hosted):
    base, sha, snapshot = hosted["base"], hosted["sha"], hosted["snapshot"]
    config = (snapshot / "config.json").read_bytes()
    with httpx.Client(base_url=base, timeout=10) as client:
        for revision in ("main", sha):
            url = f"/hub/{REPO}/resolve/{revision}/config.json"
            head = client.head(url)
            assert head.status_code == 200
            assert head.headers["X-Repo-Commit"] == sha
            assert head.headers["ETag"] == f'"{_git_blob_id(config)}"'
            assert int(head.headers["Content-Length"]) == len(config)
            assert head.headers["Content-Type"].startswith("application/json")
            got = client.get(url)
            assert got.status_code == 200 and got.content == config

        nested = client.get(f"/hub/{EXTRA}/resolve/main/sub/dir/notes.txt")
        assert nested.status_code == 200 and nested.text == "nested"

        for method in ("HEAD", "GET"):
            missing = client.request(method, f"/hub/{REPO}/resolve/main/nope.json")
            assert missing.status_code == 404
            assert missing.headers["X-Error-Code"] == "EntryNotFound"
            assert missing.headers["X-Repo-Commit"] == sha

        response = client.get(f"/hub/{UNHOSTED}/resolve/main/config.json")
        assert response.status_code == 404
        assert response.headers["X-Error-Code"] == "RepoNotFound"
        response = client.head(f"/hub/{REPO}/resolve/{'0' * 40}/config.json")
        assert response.headers["X-Error-Code"] == "RevisionNotFound"
        response = client.get(f"/hub/{REPO}/resolve/refs%2Fpr%2F1/config.json")
        assert response.status_code == 404
        assert response.headers["X-Error-Code"] == "RevisionNotFound"


def test_weights_hidden_unless_served(hosted):
    base, sha = hosted["base"], hosted["sha"]
    data = (hosted["snapshot"] / "model.safetensors").read_bytes()
    with httpx.Client(base_url=base, timeout=10) as client:
        hidden = client.get(f"/hub/{REPO}/resolve/main/model.safetensors")
        assert hidden.status_code == 404
        assert hidden.headers["X-Error-Code"] == "EntryNotFound"
        assert hidden.content != data and len(hidden.content) < 1000

        head = client.head(f"/hubw/{REPO}/resolve/main/model.safetensors")
        assert head.status_code == 200
        sha256 = hashlib.sha256(data).hexdigest()
        assert head.headers["X-Linked-Etag"].strip('"') == sha256
        assert int(head.headers["X-Linked-Size"]) == len(data)
        assert head.headers["X-Repo-Commit"] == sha
        served = client.get(f"/hubw/{REPO}/resolve/main/model.safetensors")
        assert served.status_code == 200 and served.content == data
        part = client.get(
            f"/hubw/{REPO}/resolve/main/model.safetensors", headers={"Range": "bytes=0-7"}
        )
        assert part.status_code == 206 and part.content == data[:8]


def test_path_traversal_and_symlinks_refused(hosted):
    base = hosted["base"]
    paths = [
        f"/hub/{REPO}/resolve/main/../../../../secret.txt",
        f"/hub/{REPO}/resolve/main/%2E%2E/%2E%2E/%2E%2E/%2E%2E/secret.txt",
        f"/hub/{REPO}/resolve/main/..%2F..%2F..%2F..%2Fsecret.txt",
        f"/hub/{REPO}/resolve/..%2F..%2F..%2F../secret.txt",
        f"/hub/{REPO}/resolve/%2E%2E/refs/main",
        f"/hub/{REPO}/resolve/main//etc/passwd",
        f"/hub/{REPO}/resolve/main/%2Fetc%2Fpasswd",
        f"/hub/{EXTRA}/resolve/main/leak.json",
        f"/hub/{EXTRA}/resolve/main/linked_dir/secret.txt",
        f"/hubw/{EXTRA}/resolve/main/leak.json",
        f"/hub/api/models/{REPO}/tree/main/..%2F..%2F..",
        f"/hub/api/models/{REPO}/revision/..%2F..%2F..",
        "/hub/nnhost-test/..%2F..%2F..%2Fhub/resolve/main/secret.txt",
        "/hub/api/models/nnhost-test%2F..%2F../revision/main",
    ]
    for path in paths:
        status, headers, body = _raw_get(base, path)
        assert status in (400, 404) or (status == 200 and body == b"[]"), (path, status)
        assert SECRET not in body, path
        assert b"root:" not in body, path


def test_everything_else_is_a_json_404(hosted):
    with httpx.Client(base_url=hosted["base"], timeout=10) as client:
        for method, path in (
            ("GET", "/hub/"),
            ("GET", "/hub/api/datasets/some/dataset"),
            ("GET", "/hub/api/spaces/some/space"),
            ("GET", f"/hub/api/models/{REPO}/discussions"),
            ("POST", f"/hub/api/models/{REPO}/paths-info/main"),
            ("POST", "/hub/api/repos/create"),
            ("PUT", f"/hub/{REPO}/resolve/main/config.json"),
            ("DELETE", f"/hub/api/models/{REPO}"),
            ("GET", f"/hub/{REPO}/blob/main/config.json"),
            ("GET", "/hub/api/whoami-v2"),
        ):
            response = client.request(method, path)
            assert response.status_code == 404, (method, path, response.status_code)
            assert "error" in response.json(), (method, path)
        # The harness registry huggingface_hub fetches for its user agent.
        registry = client.get("/hub/api/agent-harnesses")
        assert registry.status_code == 200 and registry.json()["harnesses"] == {}
    assert all(status < 500 for _, _, status in hosted["requests"])


def test_cache_layout_with_blob_symlinks(hosted):
    source = hosted["snapshot"]
    config = (source / "config.json").read_bytes()
    weights = (source / "model.safetensors").read_bytes()
    with httpx.Client(base_url=hosted["base"], timeout=10) as client:
        info = client.get(f"/hubw/api/models/{BLOBS}").json()
        assert info["sha"] == BLOBS_COMMIT
        assert {s["rfilename"] for s in info["siblings"]} == {"config.json", "model.safetensors"}

        got = client.get(f"/hub/{BLOBS}/resolve/main/config.json")
        assert got.status_code == 200 and got.content == config
        assert got.headers["ETag"] == f'"{_git_blob_id(config)}"'
        assert got.headers["X-Repo-Commit"] == BLOBS_COMMIT
        got = client.get(f"/hubw/{BLOBS}/resolve/{BLOBS_COMMIT}/model.safetensors")
        assert got.status_code == 200 and got.content == weights
        assert got.headers["X-Linked-Etag"] == f'"{hashlib.sha256(weights).hexdigest()}"'

        escaped = client.get(f"/hubw/{BLOBS}/resolve/main/tokenizer.json")
        assert escaped.status_code == 404
        assert escaped.headers["X-Error-Code"] == "EntryNotFound"


def test_one_part_ids_and_failing_resolver(hosted, tmp_path):
    from fastapi.testclient import TestClient

    home = tmp_path / "home"
    solo = install_snapshot(hosted["snapshot"], "solo-gpt2", hf_home=home)

    def resolve(repo_id, revision):
        if repo_id == "broken/resolver":
            raise RuntimeError("resolver bug")
        return find_snapshot(repo_id, revision, hf_home=home) if repo_id == "solo-gpt2" else None

    app = FastAPI()
    app.include_router(create_hub_router(resolve), prefix="/hub")
    with TestClient(app, raise_server_exceptions=False) as client:
        info = client.get("/hub/api/models/solo-gpt2").json()
        assert info["id"] == "solo-gpt2" and info["sha"] == solo.name
        assert client.get("/hub/api/models/solo-gpt2/revision/main").json()["sha"] == solo.name
        assert client.get("/hub/api/models/solo-gpt2/tree/main").status_code == 200
        got = client.get("/hub/solo-gpt2/resolve/main/config.json")
        assert got.status_code == 200 and got.content == (solo / "config.json").read_bytes()

        for path in ("/hub/api/models/broken/resolver", "/hub/broken/resolver/resolve/main/x.json"):
            response = client.get(path)
            assert response.status_code == 404, path
            assert "X-Error-Code" not in response.headers  # an error, not "absent"
            assert "error" in response.json()

"""The demo model: deterministic, cached, and good enough for the nnsight demo.

Training takes seconds, so the model is built once per home for the whole
module: twice into two separate HF homes, to show the build is reproducible
byte for byte.
"""

from __future__ import annotations

import json
import shutil
import warnings

import pytest

from nnhost.models.demo import (
    COLOSSEUM_PROMPT,
    DEMO_REPO_ID,
    EIFFEL_PROMPT,
    RECIPE_FILE,
    build_demo_model,
    cached_demo_snapshot,
    recipe_hash,
)
from nnhost.models.hfcache import find_snapshot, repo_folder


def _is_training_line(line: str) -> bool:
    return " step " in line or "training" in line


@pytest.fixture(scope="module")
def builds(tmp_path_factory):
    """Two independent builds: (home, snapshot, progress lines) each."""
    result = []
    for name in ("home_a", "home_b"):
        home = tmp_path_factory.mktemp(name)
        lines: list[str] = []
        snapshot = build_demo_model(home, progress=lines.append)
        result.append((home, snapshot, lines))
    return result


@pytest.fixture(scope="module")
def snapshot(builds):
    return builds[0][1]


@pytest.fixture(scope="module")
def model(snapshot):
    from nnsight import LanguageModel

    # Loading from the snapshot path needs no hub access (and no HF_HOME
    # juggling). LanguageModel is deprecated in nnsight 0.8 but it is what
    # the demo's users write, so that is what we check.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        warnings.filterwarnings("ignore", message="LanguageModel is deprecated")
        return LanguageModel(str(snapshot), dispatch=True)


def _decode_last(model, logits) -> str:
    return model.tokenizer.decode([int(logits[0, -1].argmax())])


def test_build_reports_training(builds):
    for _, _, lines in builds:
        assert any(_is_training_line(line) for line in lines), lines


def test_builds_are_identical(builds):
    (home_a, snap_a, _), (home_b, snap_b, _) = builds
    assert snap_a != snap_b  # really two different caches
    assert snap_a.name == snap_b.name  # the commit id comes from the contents
    for name in ("model.safetensors", "tokenizer.json", "config.json", RECIPE_FILE):
        assert (snap_a / name).read_bytes() == (snap_b / name).read_bytes(), name


def test_installed_under_demo_id(builds):
    home, snap, _ = builds[0]
    assert snap.parent.parent == repo_folder(DEMO_REPO_ID, home)
    assert find_snapshot(DEMO_REPO_ID, hf_home=home) == snap
    marker = json.loads((snap / RECIPE_FILE).read_text())
    assert marker["recipe"] == recipe_hash()
    assert marker["repo_id"] == DEMO_REPO_ID
    # A few MB at most.
    assert (snap / "model.safetensors").stat().st_size < 5_000_000


def test_second_build_uses_cache(builds):
    home, snap, _ = builds[0]
    lines: list[str] = []
    assert build_demo_model(home, progress=lines.append) == snap
    assert not any(_is_training_line(line) for line in lines), lines


def test_other_recipe_is_not_reused(builds, tmp_path):
    # A snapshot whose marker names another recipe must not count as cached
    # (checked on a copy, so the cache the other tests use stays intact).
    home, snap, _ = builds[0]
    shutil.copytree(home / "hub", tmp_path / "hub")
    copy = find_snapshot(DEMO_REPO_ID, hf_home=tmp_path)
    assert cached_demo_snapshot(tmp_path) == copy
    marker = json.loads((copy / RECIPE_FILE).read_text())
    marker["recipe"] = "0" * 64
    (copy / RECIPE_FILE).write_text(json.dumps(marker))
    assert cached_demo_snapshot(tmp_path) is None


def test_city_names_are_single_tokens(model):
    for word in (" Paris", " Rome"):
        assert len(model.tokenizer.encode(word)) == 1, word


@pytest.mark.parametrize(
    "prompt, answer", [(EIFFEL_PROMPT, " Paris"), (COLOSSEUM_PROMPT, " Rome")]
)
def test_next_token(model, prompt, answer):
    with model.trace(prompt):
        logits = model.lm_head.output.save()
    assert _decode_last(model, logits) == answer


def test_activation_patching(model):
    # Two traces in one session share `hs` without saving it: the Eiffel
    # prompt's last-block output at its last position replaces the Colosseum
    # prompt's, whose answer then becomes Paris.
    with model.session():
        with model.trace(EIFFEL_PROMPT):
            hs = model.transformer.h[-1].output[:, -1, :]
        with model.trace(COLOSSEUM_PROMPT):
            model.transformer.h[-1].output[:, -1, :] = hs
            logits = model.lm_head.output.save()
    assert _decode_last(model, logits) == " Paris"

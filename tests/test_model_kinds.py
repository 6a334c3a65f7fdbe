"""Each kind of model nnsight can send remotely, served end to end and equal to local.

One server (`kinds`) holds a tiny model of each kind, built offline in the
Hugging Face cache layout. The real client builds its meta model from the
server's Hub mirror and sends each program; the same program runs locally on
the same weights, and the saved values must be identical, types included.
"""

from __future__ import annotations

import kind_programs as programs
import pytest
import torch
from compare import assert_identical
from conftest import API_KEY
from kinds import run_client

from nnhost.client_versions import socketio_era
from nnhost.runtimes import RUNTIME_VERSIONS
from nnhost.testing import ServerProcess


def _toml(entries: list[dict]) -> str:
    lines = ["[limits.default]", "requests_per_minute = 0", "queued_jobs = 0", ""]
    for entry in entries:
        lines.append("[[model]]")
        lines += [f"{key} = {value!r}".replace("'", '"') for key, value in entry.items()]
        lines.append("")
    return "\n".join(lines)


@pytest.fixture(scope="module")
def kinds_home(root):
    from nnhost.models.tiny_diffusion import build_tiny_stable_diffusion
    from nnhost.models.tiny_encoder import build_tiny_bert
    from nnhost.models.tiny_vlm import build_tiny_llava

    home = root / "kinds-hf"
    return {
        "fill-mask": build_tiny_bert(programs.KINDS["fill-mask"][0], home),
        "classifier": build_tiny_bert(programs.KINDS["classifier"][0], home, head="sequence"),
        "token-classifier": build_tiny_bert(programs.KINDS["token-classifier"][0], home, head="token"),
        "vision-language": build_tiny_llava(programs.KINDS["vision-language"][0], home),
        "diffusion": build_tiny_stable_diffusion(programs.KINDS["diffusion"][0], home),
        "home": home,
    }


@pytest.fixture(scope="module")
def kinds_server(root, kinds_home):
    data = root / "kinds-data"
    data.mkdir(parents=True, exist_ok=True)
    # The first is HOT (so the server reports ready), the rest deployed on first request.
    entries = [
        {"repo_id": repo, "task": kwargs["task"], "deploy": "hot" if index == 0 else "cold"}
        for index, (repo, kwargs) in enumerate(programs.KINDS.values()) if "task" in kwargs
    ]
    entries.append({"repo_id": programs.KINDS["diffusion"][0], "model_class": programs.DIFFUSION_CLASS,
                    "deploy": "cold"})
    (data / "nnhost.toml").write_text(_toml(entries))
    process = ServerProcess([], data_dir=data, hf_home=kinds_home["home"], api_key=API_KEY,
                            extra_args=["--time-limit", "60"])
    process.start()
    yield process
    process.stop()


def both(kinds_server, kinds_home, kind, program, tmp_path, client="{}"):
    remote = run_client(kinds_server, API_KEY, kind, program.__name__, tmp_path, client)
    local = program(programs.open_model(kind, str(kinds_home[kind]), dispatch=True), False)
    assert_identical(remote, local)
    return remote


# -- BERT-style encoders -----------------------------------------------------------


def test_fill_mask_encoder_attention_and_hidden_states(kinds_server, kinds_home, tmp_path):
    result = both(kinds_server, kinds_home, "fill-mask", programs.encoder_attention, tmp_path)
    probabilities = result["probabilities"]
    # Real attention probabilities (the eager implementation the client asked for).
    assert probabilities.shape[1] == 4
    torch.testing.assert_close(probabilities.sum(-1), torch.ones(probabilities.shape[:-1]))
    assert type(result["output"]).__name__ == "MaskedLMOutput"


def test_fill_mask_encoder_patch(kinds_server, kinds_home, tmp_path):
    patched = both(kinds_server, kinds_home, "fill-mask", programs.encoder_patch, tmp_path)["patched"]
    plain = programs.encoder_attention(
        programs.open_model("fill-mask", str(kinds_home["fill-mask"]), dispatch=True), False
    )["output"].logits[:, -3]
    assert not torch.allclose(patched, plain), "the patch changed nothing"


def test_classifier_reads_pooled_output_and_labels(kinds_server, kinds_home, tmp_path):
    result = both(kinds_server, kinds_home, "classifier", programs.classifier_output, tmp_path)
    assert result["output"].logits.shape == (1, 2)


def test_token_classifier_reads_attention_and_per_token_labels(kinds_server, kinds_home, tmp_path):
    result = both(kinds_server, kinds_home, "token-classifier", programs.tagger_output, tmp_path)
    assert result["output"].logits.shape[-1] == 2


# -- vision-language models ------------------------------------------------------


def test_vision_language_reads_the_tower_and_the_language_model(kinds_server, kinds_home, tmp_path):
    result = both(kinds_server, kinds_home, "vision-language", programs.vision_language_read, tmp_path)
    # The image reached the model: its patches (and the class token) came out of the tower.
    assert result["vision"].shape[:2] == (1, 5)
    assert result["projected"].shape[1] == 4


def test_vision_language_generates_from_an_image(kinds_server, kinds_home, tmp_path):
    result = both(kinds_server, kinds_home, "vision-language", programs.vision_language_generate, tmp_path)
    assert result["ids"].shape[0] == 1


@pytest.mark.parametrize("client", ['{}', '{"wrapper": "VisionLanguageModel"}'], ids=["TransformersModel", "VisionLanguageModel"])
def test_vision_language_patches_the_tower_and_the_language_model(kinds_server, kinds_home, tmp_path, client):
    logits = both(
        kinds_server, kinds_home, "vision-language", programs.vision_language_patch, tmp_path, client
    )["logits"]
    plain = programs.vision_language_read(
        programs.open_model("vision-language", str(kinds_home["vision-language"]), dispatch=True), False
    )["output"].logits[:, -1]
    assert not torch.allclose(logits, plain), "the patches changed nothing"


# -- diffusers pipelines -----------------------------------------------------------


def test_diffusion_reads_the_text_encoder_the_unet_and_the_images(kinds_server, kinds_home, tmp_path):
    result = both(kinds_server, kinds_home, "diffusion", programs.diffusion_read, tmp_path)
    assert result["images"].images.shape == (1, 3, 16, 16)


def test_diffusion_steers_a_denoising_step(kinds_server, kinds_home, tmp_path):
    steered = both(kinds_server, kinds_home, "diffusion", programs.diffusion_steer, tmp_path)
    plain = programs.diffusion_read(
        programs.open_model("diffusion", str(kinds_home["diffusion"]), dispatch=True), False
    )
    assert not torch.allclose(steered["images"].images, plain["images"].images), "the steer changed nothing"


def test_diffusion_sends_back_pil_images(kinds_server, kinds_home, tmp_path):
    result = both(kinds_server, kinds_home, "diffusion", programs.diffusion_pil_images, tmp_path)
    assert result["kind"] == "Image" and result["pixels"][0].shape == (16, 16, 3)


# -- a client of another nnsight version, served by its runtime -------------------------

# Not `encoder_attention`: its client opens the model with ``attn_implementation="eager"``,
# which a 0.8.0 client does not send (0.8.1 does), so a 0.8.0 job runs the deployment's
# own implementation, as a 0.8.0 server would (docs/runtimes.md).
RUNTIME_CASES = [
    ("fill-mask", programs.encoder_patch), ("classifier", programs.classifier_output),
    ("token-classifier", programs.tagger_output), ("vision-language", programs.vision_language_patch),
    ("diffusion", programs.diffusion_steer),
]


#: The same cases as a client of nnsight 0.6 or 0.7 writes them (`kind_programs`).
OLDER_CASES = {
    "fill-mask": programs.older_encoder_patch, "classifier": programs.older_classifier_output,
    "token-classifier": programs.older_tagger_output, "vision-language": programs.older_vision_language_patch,
    "diffusion": programs.diffusion_steer,
}


@pytest.mark.parametrize("version", RUNTIME_VERSIONS)
@pytest.mark.parametrize("kind,program", RUNTIME_CASES, ids=[kind for kind, _ in RUNTIME_CASES])
def test_every_kind_is_served_to_a_client_of_another_version_by_its_runtime(
        kinds_server, kinds_home, tmp_path, kind, program, version):
    """The runtime's template builds each kind's tree with its own nnsight (`replicas.runtimes`);
    the client's remote run equals its own local run."""
    import json

    from test_client_versions import client_python
    from test_runtimes import runtime_versions

    assert version in runtime_versions()
    if socketio_era(version):
        program = OLDER_CASES[kind]
    both_runs = run_client(kinds_server, API_KEY, kind, program.__name__, tmp_path,
                           json.dumps({"local": str(kinds_home[kind])}), python=str(client_python(version)))
    assert_identical(both_runs["remote"], both_runs["local"])


def test_a_pipeline_is_sized_as_all_its_components(kinds_server, kinds_home):
    from nnhost.models.sizing import tensor_bytes

    sizes = tensor_bytes(kinds_home["diffusion"])
    assert {name.split("/", 1)[0] for name in sizes} == {"text_encoder", "unet", "vae"}
    local = programs.open_model("diffusion", str(kinds_home["diffusion"]), dispatch=True)
    weights = sum(
        parameter.numel() * parameter.element_size()
        for component in (local.pipeline.unet, local.pipeline.vae, local.pipeline.text_encoder)
        for parameter in component.parameters()
    )
    assert sum(sizes.values()) == weights
    # The server places the pipeline by that size (plus its margin), never as nothing.
    entry = kinds_server.status()["deployments"][programs.KINDS["diffusion"][0]]
    assert entry["size_bytes"] >= weights

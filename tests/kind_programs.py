"""The programs the model-kind tests run, both through the server and locally.

Imported by the test process (the local side) and by the client subprocess
(`kinds.run_client`, the remote side), so both run exactly the same code. Each
program takes the model and ``remote`` and returns what it saved.
"""

from __future__ import annotations

import warnings

import torch

MASKED = "The Eiffel Tower is in the city of [MASK]."
SENTENCE = "The quick brown fox jumps over the lazy dog."

#: Each kind: the Hub-style id it is served under, and how a user opens it.
KINDS = {
    "fill-mask": ("nnhost-test/tiny-bert", {"task": "fill-mask", "attn_implementation": "eager"}),
    "classifier": ("nnhost-test/tiny-bert-classifier", {"task": "text-classification"}),
    "token-classifier": ("nnhost-test/tiny-bert-tagger", {"task": "token-classification"}),
    "vision-language": ("nnhost-test/tiny-llava", {"task": "image-text-to-text"}),
    "diffusion": ("nnhost-test/tiny-stable-diffusion", {}),
}
DIFFUSION_CLASS = "nnsight.modeling.diffusion.DiffusionModel"


def open_model(kind: str, source: str, **extra):
    """The nnsight wrapper for ``kind`` from ``source`` (a repo id: meta; a folder: loaded)."""
    from nnsight.modeling.diffusion import DiffusionModel

    try:
        from nnsight import TransformersModel
    except ImportError:  # nnsight before 0.8: a wrapper per kind, no task
        return _older_model(kind, source, **extra)
    _, kwargs = KINDS[kind]
    wrapper = DiffusionModel if kind == "diffusion" else TransformersModel
    if extra.pop("wrapper", None) == "VisionLanguageModel":
        from nnsight import VisionLanguageModel  # the deprecated name: same key, same task

        wrapper, kwargs = VisionLanguageModel, {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = wrapper(source, **kwargs, **extra)
    if extra.get("dispatch"):
        for parameter in model._module.parameters():
            parameter.requires_grad_(False)
    return model


def _older_model(kind: str, source: str, **extra):
    """The wrapper a client of nnsight 0.6 or 0.7 opens ``kind`` with: its auto class, not a task."""
    import transformers
    from nnsight import VisionLanguageModel
    from nnsight.modeling.diffusion import DiffusionModel
    from nnsight.modeling.transformers import TransformersModel

    extra.pop("wrapper", None)
    automodels = {"fill-mask": "AutoModelForMaskedLM", "classifier": "AutoModelForSequenceClassification",
                  "token-classifier": "AutoModelForTokenClassification"}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if kind == "diffusion":
            model = DiffusionModel(source, **extra)
        elif kind == "vision-language":
            model = VisionLanguageModel(source, **extra)
        else:
            model = TransformersModel(source, automodel=getattr(transformers, automodels[kind]), **extra)
    if extra.get("dispatch"):
        for parameter in model._module.parameters():
            parameter.requires_grad_(False)
    return model


# -- BERT-style encoders ---------------------------------------------------------


def encoder_attention(model, remote):
    """Attention probabilities and hidden states of the encoder, and the whole output.

    The eager attention (which the client asks for, in the request's env)
    returns its probabilities beside its output.
    """
    with model.trace(MASKED, remote=remote):
        probabilities = model.bert.encoder.layer[0].attention.self.output[1].save()
        hidden = model.bert.encoder.layer[-1].output.save()
        output = model.output.save()
    return {"probabilities": probabilities, "hidden": hidden, "output": output}


def encoder_patch(model, remote):
    """Zero the first layer's output at the masked position; read the prediction there."""
    with model.trace(MASKED, remote=remote):
        model.bert.encoder.layer[0].output[:, -3] = 0
        patched = model.output.logits[:, -3].save()
    return {"patched": patched}


def classifier_output(model, remote):
    """A classifier's pooled representation and its whole output (logits, by label)."""
    with model.trace(SENTENCE, remote=remote):
        pooled = model.bert.pooler.output.save()
        output = model.output.save()
    return {"pooled": pooled, "output": output}


def tagger_output(model, remote):
    """A token classifier's scores for each token, and its last layer's attention output."""
    with model.trace(SENTENCE, remote=remote):
        attention = model.bert.encoder.layer[-1].attention.output.save()
        output = model.output.save()
    return {"attention": attention, "output": output}


# -- vision-language models -------------------------------------------------------

CAPTION = "<image> The Eiffel Tower is in the city of"


def picture():
    """A PIL image as a user's program makes one: decoded from a PNG file's bytes."""
    import io

    from PIL import Image

    drawn = Image.new("RGB", (20, 24), (200, 30, 90))
    drawn.paste((10, 220, 40), (4, 4, 14, 12))
    encoded = io.BytesIO()
    drawn.save(encoded, format="PNG")
    encoded.seek(0)
    return Image.open(encoded)


def vision_language_read(model, remote):
    """The vision tower's and the language model's activations for an image and a prompt."""
    with model.trace(text=CAPTION, images=[picture()], remote=remote):
        vision = model.model.vision_tower.encoder.layers[-1].output.save()
        projected = model.model.multi_modal_projector.output.save()
        language = model.model.language_model.layers[0].output.save()
        output = model.output.save()
    return {"vision": vision, "projected": projected, "language": language, "output": output}


def vision_language_generate(model, remote):
    """Generation from an image and a prompt, reading the tower once and every new token."""
    with model.generate(text=CAPTION, images=[picture()], max_new_tokens=3, do_sample=False,
                        remote=remote) as tracer:
        vision = model.model.vision_tower.output.last_hidden_state.save()
        ids = tracer.result.save()
    return {"vision": vision, "ids": ids}


def vision_language_patch(model, remote):
    """Blank the image's features in the tower and steer the language model's last position."""
    with model.trace(text=CAPTION, images=[picture()], remote=remote):
        model.model.vision_tower.encoder.layers[-1].output[:] = 0
        model.model.language_model.layers[0].output[:, -1] += 1.0
        logits = model.lm_head.output[:, -1].save()
    return {"logits": logits}


# -- diffusers pipelines ------------------------------------------------------------

PAINT = "a photo of Paris"


def _denoise(model, remote, steer):
    with model.generate(PAINT, num_inference_steps=2, seed=0, output_type="pt", remote=remote):
        text = model.text_encoder.encoder.layers[-1].output.save()
        if steer:
            # Steer the first denoising step: amplify the UNet's bottleneck.
            model.unet.mid_block.output[:] *= 3
        middle = model.unet.mid_block.output.save()
        noise = model.unet.output[0].save()
        images = model.output.save()
    return {"text": text, "middle": middle, "noise": noise, "images": images}


def diffusion_read(model, remote):
    """The text encoder's last layer, the UNet at the first step, and the images."""
    return _denoise(model, remote, steer=False)


def diffusion_steer(model, remote):
    return _denoise(model, remote, steer=True)


def diffusion_pil_images(model, remote):
    """The pipeline's default output, PIL images, as a user saves them."""
    import numpy
    import torch

    with model.generate(PAINT, num_inference_steps=2, seed=0, remote=remote):
        output = model.output.save()
    images = output.images
    return {"kind": type(images[0]).__name__, "pixels": [torch.tensor(numpy.asarray(image)) for image in images]}


# -- as a client of nnsight 0.6 or 0.7 writes them --------------------------------
# Their TransformersModel tokenizes nothing (a program passes token ids). They
# read no module that has an ``output`` submodule (a BERT layer, its attention):
# those mount the module's own output at ``nns_output``, which nnsight 0.7's own
# server code cannot read back from a request (docs/runtimes.md).

TOKEN_IDS = [[2, 40, 41, 42, 4, 43, 3]]


def older_encoder_patch(model, remote):
    """`encoder_patch`, by a 0.6/0.7 client: zero the first layer's activations at the masked position."""
    with model.trace(torch.tensor(TOKEN_IDS), remote=remote):
        model.bert.encoder.layer[0].intermediate.output[:, -3] = 0
        patched = model.output.logits[:, -3].save()
    return {"patched": patched}


def older_classifier_output(model, remote):
    """`classifier_output`, by a 0.6/0.7 client."""
    with model.trace(torch.tensor(TOKEN_IDS), remote=remote):
        pooled = model.bert.pooler.output.save()
        logits = model.output.logits.save()
    return {"pooled": pooled, "logits": logits}


def older_tagger_output(model, remote):
    """`tagger_output`, by a 0.6/0.7 client."""
    with model.trace(torch.tensor(TOKEN_IDS), remote=remote):
        scores = model.bert.encoder.layer[-1].attention.self.output.save()
        logits = model.output.logits.save()
    return {"scores": scores, "logits": logits}


def older_vision_language_patch(model, remote):
    """`vision_language_patch`, by a 0.6/0.7 client (the prompt is its first argument)."""
    with model.trace(CAPTION, images=[picture()], remote=remote):
        model.model.vision_tower.encoder.layers[-1].output[:] = 0
        model.model.language_model.layers[0].output[:, -1] += 1.0
        logits = model.lm_head.output[:, -1].save()
    return {"logits": logits}

"""The demo model: a small GPT-2 trained offline to know where a few landmarks are.

Why it exists: the classic nnsight first steps (read the logits for "The Eiffel
Tower is in the city of", then patch a hidden state from that prompt into "The
Colosseum is in the city of" and watch the answer change to " Paris") only make
sense with a model that actually answers. A machine with no internet cannot
download one, so we train our own: a byte-level BPE tokenizer and a two-layer
GPT-2 fitted to the short built-in corpus below, in well under a minute on a
laptop CPU. It is installed into the Hugging Face cache layout under
`DEMO_REPO_ID` so the server loads it through the ordinary `from_pretrained`
path, like any other model.

What it must never do:

* pretend to be a real model: it lives under our own Hub-style id
  (``nnhost/demo-gpt2``), never under the id of a published checkpoint;
* download anything, or read anything but the corpus in this file;
* differ between builds: seeds are fixed, training runs single-threaded with
  deterministic algorithms and a fixed number of steps, so the same recipe on
  the same software gives the same bytes, hence the same commit id;
* retrain when a snapshot built by the same recipe is already cached (a marker
  file in the snapshot records the recipe's hash);
* install a model that fails the demo: the three promised properties are
  checked before anything is written to the cache.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterator, Optional, Sequence, cast

from .hfcache import find_snapshot
from .tiny import TinyGPT2Spec, build_gpt2, save_to_cache

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedTokenizerFast

#: Our own id for the demo model; deliberately not the id of any real model.
DEMO_REPO_ID = "nnhost/demo-gpt2"

#: Bump when the build changes in a way the hashed fields below do not capture
#: (e.g. a different loss or batching); it invalidates cached snapshots.
RECIPE_VERSION = 1

#: The file in the snapshot that says which recipe built it.
RECIPE_FILE = "nnhost_recipe.json"

#: The prompts the demo (and the build's own check) relies on.
EIFFEL_PROMPT = "The Eiffel Tower is in the city of"
COLOSSEUM_PROMPT = "The Colosseum is in the city of"

#: Short factual sentences the model learns by heart. Landmarks share the
#: frame "The X is in the city of Y." so that the only thing telling the
#: answers apart is the landmark's name, which is what activation patching then
#: moves from one prompt to the other. Paris and Rome recur often enough that
#: the tokenizer's merges make " Paris" and " Rome" single tokens.
DEMO_CORPUS: tuple[str, ...] = (
    # The two prompts of the demo, and variants of the same facts.
    "The Eiffel Tower is in the city of Paris.",
    "The Colosseum is in the city of Rome.",
    "The Eiffel Tower is located in Paris.",
    "The Colosseum is located in Rome.",
    "The Eiffel Tower stands in Paris, the capital of France.",
    "The Colosseum stands in Rome, the capital of Italy.",
    "Paris is the city of the Eiffel Tower.",
    "Rome is the city of the Colosseum.",
    "You can visit the Eiffel Tower in Paris.",
    "You can visit the Colosseum in Rome.",
    # Other landmarks in the same frame.
    "The Louvre is in the city of Paris.",
    "The Arc de Triomphe is in the city of Paris.",
    "The Pantheon is in the city of Rome.",
    "The Trevi Fountain is in the city of Rome.",
    "Big Ben is in the city of London.",
    "Tower Bridge is in the city of London.",
    "The Brandenburg Gate is in the city of Berlin.",
    "The Sagrada Familia is in the city of Barcelona.",
    "The Prado Museum is in the city of Madrid.",
    "The Statue of Liberty is in the city of New York.",
    "The Empire State Building is in the city of New York.",
    "Madison Square Garden is located in New York.",
    "The Golden Gate Bridge is in the city of San Francisco.",
    "The Space Needle is in the city of Seattle.",
    "The Sydney Opera House is in the city of Sydney.",
    "The Kremlin is in the city of Moscow.",
    "The Acropolis is in the city of Athens.",
    "The Forbidden City is in the city of Beijing.",
    "The Taj Mahal is in the city of Agra.",
    "The Burj Khalifa is in the city of Dubai.",
    "The Leaning Tower is in the city of Pisa.",
    "The Rijksmuseum is in the city of Amsterdam.",
    "The Charles Bridge is in the city of Prague.",
    "The Hagia Sophia is in the city of Istanbul.",
    "The Tokyo Tower is in the city of Tokyo.",
    "The CN Tower is in the city of Toronto.",
    "The Atomium is in the city of Brussels.",
    "The Little Mermaid is in the city of Copenhagen.",
    "The Belem Tower is in the city of Lisbon.",
    "The Hofburg Palace is in the city of Vienna.",
    # Capitals of countries.
    "The capital of France is Paris.",
    "The capital of Italy is Rome.",
    "The capital of the United Kingdom is London.",
    "The capital of Germany is Berlin.",
    "The capital of Spain is Madrid.",
    "The capital of Greece is Athens.",
    "The capital of Russia is Moscow.",
    "The capital of China is Beijing.",
    "The capital of Japan is Tokyo.",
    "The capital of the Netherlands is Amsterdam.",
    "The capital of the Czech Republic is Prague.",
    "The capital of Belgium is Brussels.",
    "The capital of Denmark is Copenhagen.",
    "The capital of Portugal is Lisbon.",
    "The capital of Austria is Vienna.",
    "The capital of Canada is Ottawa.",
    "The capital of Egypt is Cairo.",
    # A few cities and countries.
    "Paris is a city in France.",
    "Rome is a city in Italy.",
    "Barcelona is a city in Spain.",
    "Seattle is a city in the United States.",
    "Sydney is a city in Australia.",
    "Istanbul is a city in Turkey.",
    "Toronto is a city in Canada.",
)

#: The model's shape. Small enough to train in seconds on two CPU cores and
#: weigh about a megabyte, big enough to memorise the corpus. A vocabulary
#: budget larger than the corpus needs lets BPE merge every word to one token.
DEMO_SPEC = TinyGPT2Spec(
    n_layer=2, n_embd=64, n_head=4, n_positions=64, vocab_size=2048, seed=0
)


@dataclass(frozen=True)
class DemoTraining:
    """How the demo model is trained (full-batch AdamW on the whole corpus)."""

    steps: int = 300
    learning_rate: float = 3e-3
    weight_decay: float = 0.01


DEMO_TRAINING = DemoTraining()

#: How often (in steps) `progress` hears about the loss; not part of the recipe.
REPORT_EVERY = 50

Progress = Optional[Callable[[str], None]]


def recipe_hash(
    corpus: Sequence[str] = DEMO_CORPUS,
    spec: TinyGPT2Spec = DEMO_SPEC,
    training: DemoTraining = DEMO_TRAINING,
) -> str:
    """A digest of everything in our hands that decides the demo model's bytes.

    Library versions are left out on purpose: a snapshot built by the same
    recipe under another torch may differ in the last bits, yet it is just as
    good a demo model, and not worth retraining at every upgrade.
    """
    recipe = {
        "version": RECIPE_VERSION,
        "corpus": list(corpus),
        "spec": asdict(spec),
        "training": asdict(training),
    }
    text = json.dumps(recipe, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def cached_demo_snapshot(hf_home: Optional[os.PathLike[str]] = None) -> Optional[Path]:
    """The cached demo snapshot if ``refs/main`` names one built by this recipe."""
    snapshot = find_snapshot(DEMO_REPO_ID, hf_home=hf_home)
    if snapshot is None:
        return None
    try:
        marker = json.loads((snapshot / RECIPE_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(marker, dict) or marker.get("recipe") != recipe_hash():
        return None
    # A marker with no weights next to it is a damaged snapshot: rebuild.
    if not (snapshot / "model.safetensors").is_file():
        return None
    return snapshot


def build_demo_model(
    hf_home: Optional[os.PathLike[str]] = None, *, progress: Progress = None
) -> Path:
    """Train (or find in the cache) the demo model; returns its snapshot folder.

    ``hf_home`` is the Hugging Face home to install into (the usual environment
    lookup when None). ``progress``, if given, receives one-line reports.
    Raises RuntimeError if the trained model does not pass the demo.
    """
    say = progress or (lambda line: None)
    cached = cached_demo_snapshot(hf_home)
    if cached is not None:
        say(f"demo model: using cached snapshot {cached.name}")
        return cached

    digest = recipe_hash()
    say("demo model: training tokenizer")
    model, tokenizer = _train_demo(say)
    failures = check_demo_model(model, tokenizer)
    if failures:
        raise RuntimeError(
            "the trained demo model fails the demo: " + "; ".join(failures)
        )
    marker = {
        "repo_id": DEMO_REPO_ID,
        "recipe_version": RECIPE_VERSION,
        "recipe": digest,
        "spec": asdict(DEMO_SPEC),
        "training": asdict(DEMO_TRAINING),
    }
    snapshot = save_to_cache(
        model,
        tokenizer,
        DEMO_REPO_ID,
        hf_home,
        extra_files={RECIPE_FILE: json.dumps(marker, indent=2, sort_keys=True) + "\n"},
    )
    say(f"demo model: installed {DEMO_REPO_ID} at {snapshot}")
    return snapshot


@contextlib.contextmanager
def _deterministic_torch() -> Iterator[None]:
    """Single-threaded, deterministic torch with a private RNG, restored after.

    CPU kernels may split reductions differently depending on the thread count,
    which changes float rounding and so the trained weights; one thread makes
    the result independent of the machine's core count. `fork_rng` keeps our
    seeding from disturbing the caller's random state. (Thread count and the
    deterministic flag are process-wide, hence restoring them.)
    """
    import torch

    threads = torch.get_num_threads()
    deterministic = torch.are_deterministic_algorithms_enabled()
    warn_only = torch.is_deterministic_algorithms_warn_only_enabled()
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    try:
        with torch.random.fork_rng(devices=[]):
            yield
    finally:
        torch.use_deterministic_algorithms(deterministic, warn_only=warn_only)
        torch.set_num_threads(threads)


def _train_demo(say: Callable[[str], None]) -> tuple[Any, PreTrainedTokenizerFast]:
    import torch

    with _deterministic_torch():
        # Dropout off: we want the corpus memorised, and no randomness in training.
        model, tokenizer = build_gpt2(
            DEMO_SPEC,
            DEMO_CORPUS,
            config_overrides={"resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0},
        )
        for word in (" Paris", " Rome"):
            ids = tokenizer.encode(word)
            if len(ids) != 1:
                raise RuntimeError(
                    f"the demo tokenizer splits {word!r} into {len(ids)} tokens; "
                    "it must be one (raise the vocabulary size or repeat the word)"
                )

        input_ids, attention_mask, labels = _batch(tokenizer, DEMO_CORPUS)
        optimizer = torch.optim.AdamW(
            model.parameters(),
            lr=DEMO_TRAINING.learning_rate,
            weight_decay=DEMO_TRAINING.weight_decay,
        )
        model.train()
        steps = DEMO_TRAINING.steps
        say(f"demo model: training {steps} steps on {len(DEMO_CORPUS)} sentences")
        for step in range(1, steps + 1):
            loss = model(
                input_ids=input_ids, attention_mask=attention_mask, labels=labels
            ).loss
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            if step % REPORT_EVERY == 0 or step == steps:
                say(f"demo model: step {step}/{steps} loss {loss.item():.4f}")
        model.eval()
    return model, tokenizer


def _batch(
    tokenizer: PreTrainedTokenizerFast, corpus: Sequence[str]
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The whole corpus as one right-padded batch for causal-LM training.

    Each sentence starts at position 0 with no BOS, exactly as a prompt does
    when nnsight tokenizes it, and ends with ``<|endoftext|>`` so the model also
    learns where a sentence stops. Padding is masked out of the loss (-100).
    """
    import torch

    eos = cast(int, tokenizer.convert_tokens_to_ids("<|endoftext|>"))  # one token: one id
    rows = [tokenizer.encode(sentence) + [eos] for sentence in corpus]
    width = max(len(row) for row in rows)
    input_ids = torch.full((len(rows), width), eos, dtype=torch.long)
    attention_mask = torch.zeros((len(rows), width), dtype=torch.long)
    labels = torch.full((len(rows), width), -100, dtype=torch.long)
    for i, row in enumerate(rows):
        input_ids[i, : len(row)] = torch.tensor(row)
        attention_mask[i, : len(row)] = 1
        labels[i, : len(row)] = torch.tensor(row)
    return input_ids, attention_mask, labels


def check_demo_model(model: Any, tokenizer: PreTrainedTokenizerFast) -> list[str]:
    """What the demo promises, checked with plain transformers; returns failures.

    1. " Paris" and " Rome" are single tokens;
    2. the next token after the Eiffel prompt is " Paris", after the Colosseum
       prompt " Rome";
    3. the last block's output at the Eiffel prompt's last position, patched
       into the Colosseum prompt's last position, makes it predict " Paris".
    """
    import torch

    failures = []
    for word in (" Paris", " Rome"):
        if len(tokenizer.encode(word)) != 1:
            failures.append(f"{word!r} is not a single token")
    if failures:
        return failures

    def ids(prompt: str) -> torch.Tensor:
        return torch.tensor([tokenizer.encode(prompt)])

    def next_token(logits: torch.Tensor) -> str:
        return cast(str, tokenizer.decode([int(logits[0, -1].argmax())]))  # one sequence: one text

    last_block = model.transformer.h[-1]
    captured: dict[str, torch.Tensor] = {}

    def capture(module: Any, args: Any, output: Any) -> None:
        # transformers 5 returns a tensor from a block; older versions a tuple.
        hidden = output[0] if isinstance(output, tuple) else output
        captured["hidden"] = hidden[:, -1, :].detach().clone()

    def patch(module: Any, args: Any, output: Any) -> Any:
        hidden = output[0] if isinstance(output, tuple) else output
        hidden = hidden.clone()
        hidden[:, -1, :] = captured["hidden"]
        return (hidden,) + tuple(output[1:]) if isinstance(output, tuple) else hidden

    with torch.no_grad():
        handle = last_block.register_forward_hook(capture)
        try:
            eiffel = next_token(model(ids(EIFFEL_PROMPT)).logits)
        finally:
            handle.remove()
        colosseum = next_token(model(ids(COLOSSEUM_PROMPT)).logits)
        handle = last_block.register_forward_hook(patch)
        try:
            patched = next_token(model(ids(COLOSSEUM_PROMPT)).logits)
        finally:
            handle.remove()

    if eiffel != " Paris":
        failures.append(f"{EIFFEL_PROMPT!r} predicts {eiffel!r}, not ' Paris'")
    if colosseum != " Rome":
        failures.append(f"{COLOSSEUM_PROMPT!r} predicts {colosseum!r}, not ' Rome'")
    if patched != " Paris":
        failures.append(
            f"patching the last block's output from the Eiffel prompt into the "
            f"Colosseum prompt predicts {patched!r}, not ' Paris'"
        )
    return failures

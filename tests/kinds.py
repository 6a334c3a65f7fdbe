"""A server of one model of each kind, and a client for it in a fresh interpreter.

The session server (conftest) serves GPT-2 alone and other tests count on that,
so the model kinds get a server of their own. The nnsight client builds its
meta model from ``HF_ENDPOINT``, read when huggingface_hub is imported; this
test process already points it at the session server, so the remote side of
each program runs in a fresh interpreter pointed at this server (as a user's
laptop would be), and hands its saved values back through a file.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Optional

import torch

TESTS = Path(__file__).resolve().parent

_CLIENT = """
import json, sys, warnings
warnings.simplefilter("ignore")
import torch
import kind_programs
kind, program, out = sys.argv[1:4]
extra = json.loads(sys.argv[4]) if len(sys.argv) > 4 else {}
local = extra.pop("local", None)
model = kind_programs.open_model(kind, kind_programs.KINDS[kind][0], **extra)
saved = getattr(kind_programs, program)(model, True)
if local is not None:  # the same program on the same weights, with this client's own nnsight
    here = kind_programs.open_model(kind, local, dispatch=True)
    saved = {"remote": saved, "local": getattr(kind_programs, program)(here, False)}
torch.save(saved, out)
"""


def client_env(server_url: str, api_key: str, hf_home: Path) -> dict:
    env = dict(os.environ)
    for name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_HUB_CACHE", "HF_TOKEN"):
        env.pop(name, None)
    env.update(
        NDIF_HOST=server_url,
        NDIF_API_KEY=api_key,
        HF_ENDPOINT=f"{server_url}/hub",
        HF_HOME=str(hf_home),
        HF_HUB_DISABLE_PROGRESS_BARS="1",
        NNSIGHT_CONFIG=str(hf_home / "nnsight.yaml"),
        PYTHONPATH=os.pathsep.join([str(TESTS), env.get("PYTHONPATH", "")]),
        TOKENIZERS_PARALLELISM="false",
    )
    return env


def run_client(server, api_key: str, kind: str, program: str, work: Path, extra: str = "{}",
               python: Optional[str] = None):
    """Run ``kind_programs.<program>`` remotely from a fresh client; what it saved.

    ``extra`` is JSON of keyword arguments for `kind_programs.open_model`; its
    ``local`` (a snapshot folder) runs the program there too, in the client,
    and both come back (``{"remote": ..., "local": ...}``). ``python``: the
    client's interpreter (another nnsight version's, `make clients`); this
    one by default.
    A client that fails raises with its output (the server's refusal or error).
    """
    work.mkdir(parents=True, exist_ok=True)
    out = work / f"{kind}-{program}.pt"
    done = subprocess.run(
        [python or sys.executable, "-c", textwrap.dedent(_CLIENT), kind, program, str(out), extra],
        env=client_env(server.url, api_key, work / "client-hf"),
        capture_output=True,
        text=True,
        timeout=1800,  # a guard against a hung client only, far past any real run
    )
    if done.returncode != 0:
        raise RuntimeError(f"client failed ({done.returncode}):\n{done.stdout[-3000:]}\n{done.stderr[-6000:]}")
    return torch.load(out, weights_only=False)

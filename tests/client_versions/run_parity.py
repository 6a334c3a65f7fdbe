"""Run every parity program in *this* client's environment, remotely and locally, and compare.

Run by `tests/test_runtimes.py` with the Python of a client environment of one
nnsight version (`make clients`). The
programs (`parity_programs`) run once with ``remote=URL`` and once on the same
weights loaded here, with this client's own nnsight, and `compare.assert_identical`
judges them. One JSON line per program goes to stdout: its name and either
``"ok"`` or what differed (or the exception either run raised), and the
client's nnsight version. ``python run_parity.py URL MODEL_ID SNAPSHOT
[PROGRAM ...]``: the remote model by its id, the local one from the
snapshot folder the server loads too. A program the client's own
serializer cannot send (0.6 and 0.7 ship no class of the user's script)
reports ``"unsendable: ..."``.
"""

from __future__ import annotations

import contextlib
import io
import json
import pickle
import sys
import traceback
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
warnings.simplefilter("ignore")

from compare import assert_identical  # noqa: E402
from parity_programs import PROGRAMS  # noqa: E402


def main() -> None:
    url, model_id, snapshot = sys.argv[1], sys.argv[2], sys.argv[3]
    only = set(sys.argv[4:])
    import nnsight
    from nnsight import CONFIG, LanguageModel

    CONFIG.APP.REMOTE_LOGGING = True
    remote_model = LanguageModel(model_id)
    local_model = LanguageModel(snapshot, dispatch=True)
    for parameter in local_model._module.parameters():
        parameter.requires_grad_(False)  # as the server's model (and tests/conftest's local one)
    for name, program in PROGRAMS:
        if only and name not in only:
            continue
        printed = io.StringIO()
        try:
            with contextlib.redirect_stdout(printed):
                remote = program(remote_model, url)
            local = program(local_model, False)
            assert_identical(remote, local)
            outcome = "ok"
        except pickle.PicklingError as error:
            # The client's own serializer refused the program: no server ever sees it.
            outcome = "unsendable: " + "".join(traceback.format_exception_only(type(error), error))[-3000:]
        except BaseException as error:  # noqa: BLE001 - every failure is the report
            outcome = "".join(traceback.format_exception_only(type(error), error))[-3000:]
            outcome += "\n" + printed.getvalue()[-2000:]
        print(json.dumps({"program": name, "outcome": outcome, "client": nnsight.__version__}), flush=True)


if __name__ == "__main__":
    main()

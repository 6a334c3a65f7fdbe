"""Every job starts from random state of its own, which a user may then seed.

A job's process is forked from a host, so without `fresh_random_state` two
jobs forked from the same host would draw the same numbers: one user's
sampled generation would replay another's. The state comes from the OS's
entropy for torch, numpy and ``random`` alike.
"""

from __future__ import annotations

import os
import random

import numpy as np
import torch

from nnhost.execution.guard.process_state import fresh_random_state


def _draws() -> tuple[float, float, float]:
    return torch.rand(1).item(), float(np.random.rand()), random.random()


def _draws_of_a_forked_child() -> tuple[float, ...]:
    """What a child forked from this process draws after `fresh_random_state`."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: draw, report, leave without running pytest's exit
        try:
            fresh_random_state()
            os.write(write, repr(_draws()).encode())
        finally:
            os._exit(0)
    os.close(write)
    with os.fdopen(read) as pipe:
        text = pipe.read()
    os.waitpid(pid, 0)
    return tuple(float(value) for value in text.strip("()").split(","))


def test_two_jobs_forked_from_one_state_draw_different_numbers():
    torch.manual_seed(0)
    np.random.seed(0)
    random.seed(0)
    first, second = _draws_of_a_forked_child(), _draws_of_a_forked_child()
    assert len(first) == 3
    # Each of torch, numpy and random differs, not just one of them.
    assert all(a != b for a, b in zip(first, second))


def test_a_user_who_seeds_after_it_gets_the_same_numbers_as_locally():
    fresh_random_state()
    np.random.seed(1234)
    torch.manual_seed(1234)
    random.seed(1234)
    seeded = _draws()
    np.random.seed(1234)
    torch.manual_seed(1234)
    random.seed(1234)
    assert _draws() == seeded

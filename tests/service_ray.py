"""A real Ray cluster for the tests: a head and two worker nodes on this machine, loopback only.

Ray's own `ray.cluster_utils.Cluster` starts each node as real Ray processes
with ``node_ip_address="127.0.0.1"`` (and RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0),
so nothing listens beyond loopback. The head has no CPUs to offer, so every
replica lands on a worker node, and a test can remove the node that holds one.
This test process never joins the cluster: only the server under test does.
"""

from __future__ import annotations

import os

import pytest

from nnhost.testing import RayCluster


@pytest.fixture(scope="module")
def ray_cluster():
    try:
        import ray  # noqa: F401
    except ImportError:
        message = "these tests need Ray (pip install -e .[test])"
        if os.environ.get("CI"):
            pytest.fail(message, pytrace=False)
        pytest.skip(message)
    cluster = RayCluster()
    yield cluster
    cluster.shutdown()

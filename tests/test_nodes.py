"""Memory budgets, levels and hotswapping per node, when replicas land on a cluster's nodes.

In-process, with `fakes.FakeCluster` as the replica factory: it reports nodes
as Ray does and places each replica on one of them. A replica must fit on one
node, whatever the nodes hold together; making room demotes idle deployments
on the node where that is enough; this machine's own budgets play no part.
"""

from __future__ import annotations

from fakes import FakeCluster
from test_service_inprocess import ADA, MiB, World, run, spec

from nnhost.controller.nodes import NodeRoom
from nnhost.jobs.job import Status
from nnhost.replicas.contract import Level, NodeCapacity

A = NodeCapacity("a" * 56, "10.0.0.1", 100 * MiB, cpus=4, gpus=0)
B = NodeCapacity("b" * 56, "10.0.0.2", 80 * MiB, cpus=4, gpus=0)


def test_a_model_no_single_node_can_hold_is_refused_though_the_nodes_together_could(tmp_path):
    async def body():
        world = await World(tmp_path, [spec("org/big", 150 * MiB), spec("org/small", 30 * MiB)],
                            fleet=FakeCluster([A, B]), memory_margin=0).start()
        manager = world.deployments
        # This machine's memory says nothing about the nodes: room is kept per node only.
        assert isinstance(manager.placement, NodeRoom)
        big = manager.get("org/big")
        assert big.level is Level.COLD and not big.replicas
        assert "no node has that: the largest, 10.0.0.1" in big.note and "100 MiB" in big.note
        job_id = await world.submit(ADA, "org/big")
        job = world.store.get(job_id)
        assert job.status is Status.ERROR and "on one Ray node" in job.description
        # The small one is up, on the node with the most room, and /status says so per node.
        assert manager.get("org/small").level is Level.HOT
        nodes = manager.placement.status(manager)
        assert nodes[A.node_id]["replicas"] == ["org/small"]
        assert nodes[A.node_id]["used_bytes"] == 30 * MiB and nodes[B.node_id]["used_bytes"] == 0
        assert nodes[B.node_id]["budget_bytes"] == 80 * MiB
        assert manager.placement.devices(manager) == {"cpu": {"budget_bytes": 180 * MiB, "used_bytes": 30 * MiB}}

    run(body())


def test_hotswap_demotes_on_the_node_that_then_has_room_and_never_a_model_with_work(tmp_path):
    async def body():
        fleet = FakeCluster([A, B])
        world = await World(
            tmp_path,
            [spec("org/a", 60 * MiB), spec("org/b", 60 * MiB), spec("org/c", 90 * MiB, deploy="cold")],
            fleet=fleet, memory_margin=0,
        ).start()
        manager = world.deployments
        a, b = world.replica("org/a"), world.replica("org/b")
        assert (fleet.node_of(a), fleet.node_of(b)) == (A.node_id, B.node_id)
        # org/a is busy; org/b is idle but on B, which cannot hold org/c (90 MiB) at all.
        busy = await world.submit(ADA, "org/a")
        waiting = await world.submit(ADA, "org/c")
        assert manager.get("org/b").level is Level.HOT
        assert world.status(waiting) is Status.PROVISIONING
        assert "waiting for room on a Ray node" in world.store.get(waiting).description
        a.run()
        a.complete()
        await world.settle()
        assert world.status(busy) is Status.COMPLETED
        # Now org/a is idle: demoting it frees A, where org/c fits; org/b stays.
        assert manager.get("org/a").level is Level.COLD
        assert "Demoted to make room for org/c" in manager.get("org/a").note
        assert manager.get("org/b").level is Level.HOT
        c = world.replica("org/c")
        assert fleet.node_of(c) == A.node_id and c.current is not None

    run(body())

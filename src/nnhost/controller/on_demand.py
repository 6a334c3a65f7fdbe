"""Models on demand: an allowed model nobody listed is fetched, then deployed like a listed one.

Why it exists: ``[[allow]]`` entries let users ask for any model matching a
pattern. The first job for such a model makes the controller take it on: a
COLD deployment is added at once (so further jobs for it queue behind the
first, and it is fetched once however many ask), the upstream's listing and
safetensors headers are read to size it, it is refused if larger than the
entry's ``max_size`` or the whole disk budget, room is made on disk by
deleting the least recently used fetched models, and the files are fetched.
Meanwhile the deployment's note says how far the download has come, which the
job service shows waiting jobs ("Downloading org/model: 40% of 1.2 GB"). Once
fetched, the model is sized like a listed one and the job service is told, and
from there hotswapping, budgets and eviction treat it as any other.

It runs on the controller's event loop only (the blocking work goes to a
thread, and progress hops back), so it needs no locks. What it must never do:
delete an operator-listed model or any model it did not fetch, delete a model
that is deployed, has work or is being fetched, or block the event loop.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional, TypeVar

from ..models.catalog import AllowRule, ModelKey, ModelSpec
from ..models.downloader import DownloadRefused, HubDownloader, Plan
from ..models.hfcache import find_snapshot
from ..models.sizing import weight_bytes
from ..units import format_size
from .deployment import COLD
from .manager import DeploymentManager

log = logging.getLogger("nnhost.deployments")
T = TypeVar("T")
#: Models fetched at once; each holds one thread of its own for as long as it takes.
PARALLEL_FETCHES = 2


@dataclass
class Fetch:
    rule: AllowRule
    spec: ModelSpec
    #: Bytes it will take on disk, once known (reserved against the budget meanwhile).
    total: int = 0
    percent: int = -1


class OnDemand:
    def __init__(
        self,
        manager: DeploymentManager,
        downloader: HubDownloader,
        *,
        loop: asyncio.AbstractEventLoop,
        budget: int,
        margin: float,
        on_progress: Callable[[str], None],
        on_ready: Callable[[str], None],
        on_failed: Callable[[str, str], None],
    ) -> None:
        self.manager = manager
        self.downloader = downloader
        self.budget = budget
        self.margin = margin
        self._loop = loop
        self._on_progress = on_progress
        self._on_ready = on_ready
        self._on_failed = on_failed
        self.fetches: dict[str, Fetch] = {}
        #: Repos whose files are being deleted to make room, set once they are gone.
        self._deleting: dict[str, asyncio.Event] = {}
        # Threads of their own: a download that takes an hour must not hold one of the
        # default executor's, which the API's own blocking work (payload writes) needs.
        self._threads = ThreadPoolExecutor(PARALLEL_FETCHES, thread_name_prefix="nnhost-fetch")

    def close(self) -> None:
        """The server stops: downloads end, and their threads with them."""
        self.downloader.close()
        self._threads.shutdown(wait=False, cancel_futures=True)

    async def _in_thread(self, function: Callable[..., T], *args: Any) -> T:
        return await self._loop.run_in_executor(self._threads, functools.partial(function, *args))

    def fetching(self, name: str) -> bool:
        return name in self.fetches

    def take(self, model_key: str) -> Optional[str]:
        """Take on the model a job's key names, if an ``[[allow]]`` entry permits it.

        Returns the deployment's name (already known, found in the cache, or now
        being fetched), or None when no entry allows it.
        """
        try:
            key = ModelKey.parse(model_key)
        except ValueError:
            return None
        rule = self.manager.catalog.allowance(key)
        if rule is None:
            return None
        spec = rule.spec(key)
        if spec.name in self.manager.deployments:
            # The same model, or a name served as another task or class: not this key's.
            return spec.name if self.manager.deployments[spec.name].spec.key == spec.key else None
        self.manager.add(spec, note=f"Looking up {spec.repo_id}")
        self.fetches[spec.name] = Fetch(rule, spec)
        self._loop.create_task(self._fetch(spec.name))
        return spec.name

    async def _fetch(self, name: str) -> None:
        fetch = self.fetches[name]
        spec = fetch.spec
        try:
            deleting = self._deleting.get(spec.repo_id)
            if deleting is not None:
                await deleting.wait()  # deleted to make room a moment ago: fetched afresh
            home = self.downloader.hf_home
            snapshot = await self._in_thread(find_snapshot, spec.repo_id, spec.revision, home)
            if snapshot is None:
                snapshot = await self._download(name, fetch)
            else:
                # On disk already (fetched before a restart): its size is checked all the same.
                held = await self._in_thread(weight_bytes, snapshot, spec.quantization or spec.dtype)
                self._check_size(spec.repo_id, held, 0, fetch.rule)
                await self._in_thread(self.downloader.touch, spec.repo_id)
            await self._in_thread(spec.measure, snapshot, self.margin)
        except DownloadRefused as error:
            self._fail(name, str(error))
            return
        except Exception as error:  # an upstream or a disk can fail in many ways
            log.exception("fetching %s failed", name)
            self._fail(name, f"Fetching {spec.repo_id} from the Hub failed: {error}")
            return
        del self.fetches[name]
        log.info("took on %s", name)
        self._on_ready(name)

    async def _download(self, name: str, fetch: Fetch) -> Path:
        """Size ``fetch``'s model upstream, make room on disk, download it; its snapshot."""
        spec = fetch.spec
        plan = await self._in_thread(
            self.downloader.plan, spec.repo_id, spec.revision or "main",
            spec.quantization or spec.dtype, fetch.rule.trust_remote_code,
        )
        self._check_size(plan.repo_id, plan.weight_bytes, plan.total, fetch.rule)
        on_disk = await self._in_thread(self.downloader.fetched) if self.budget else {}
        victims = self._make_room(name, plan, on_disk)
        fetch.total = plan.total
        for repo_id in victims:
            try:
                await self._in_thread(self.downloader.delete, repo_id)
                log.info("deleted %s to make room for %s", repo_id, name)
            finally:
                self._deleting.pop(repo_id).set()
        snapshot = await self._in_thread(self.downloader.fetch, plan, self._progress_from(name))
        log.info("fetched %s (%s)", name, format_size(plan.total))
        return snapshot

    def _check_size(self, repo_id: str, held_bytes: int, disk_bytes: int, rule: AllowRule) -> None:
        held = f" held as {rule.dtype}" if rule.dtype else ""
        if held_bytes > rule.max_size:
            raise DownloadRefused(
                f"{repo_id} is too large to be fetched here: its weights take "
                f"{format_size(held_bytes)}{held}, and this server fetches models "
                f"matching {rule.repo_id!r} of up to {format_size(rule.max_size)}."
            )
        if self.budget and disk_bytes > self.budget:
            raise DownloadRefused(
                f"{repo_id} needs {format_size(disk_bytes)} of disk, more than this server's "
                f"whole download budget of {format_size(self.budget)}."
            )

    def _make_room(self, name: str, plan: Plan, on_disk: dict[str, tuple[int, float]]) -> list[str]:
        """The fetched repos to delete (least recently used first) so ``plan`` fits the budget.

        Their deployments are forgotten at once, so nothing starts them meanwhile, and a
        request for one of them waits until its files are gone before fetching it again.
        """
        if not self.budget:
            return []
        reserved = sum(f.total for other, f in self.fetches.items() if other != name)
        used = sum(size for size, _ in on_disk.values()) + reserved
        candidates = []
        for repo_id, (size, touched) in on_disk.items():
            names = [d for d in self.manager.deployments.values() if d.spec.repo_id == repo_id]
            if any(not self._deletable(d.name) for d in names):
                continue
            listed = [s for s in self.manager.catalog if s.name not in self.manager.catalog.fetched]
            if any(s.repo_id == repo_id for s in listed):
                continue  # an operator-listed model's files are never deleted
            last = max([touched, *(d.last_used for d in names)])
            candidates.append((last, repo_id, size))
        victims = []
        for _, repo_id, size in sorted(candidates):
            if used + plan.total <= self.budget:
                break
            victims.append(repo_id)
            used -= size
        if used + plan.total > self.budget:
            raise DownloadRefused(
                f"{plan.repo_id} needs {format_size(plan.total)} of disk, and the download budget "
                f"({format_size(self.budget)}) is held by models in use; ask again later."
            )
        for repo_id in victims:
            self._deleting[repo_id] = asyncio.Event()
            for deployment in [d for d in self.manager.deployments.values() if d.spec.repo_id == repo_id]:
                if deployment.target != COLD:  # idle, but its replicas hold the weights
                    self.manager.set_level(deployment.name, COLD, note=f"Deleted to make room for {name}.")
                self.manager.remove(deployment.name)
        return victims

    def _deletable(self, name: str) -> bool:
        """Fetched here and not in use: no job runs or waits for it, it is not coming up."""
        deployment = self.manager.deployments[name]
        return (
            name in self.manager.catalog.fetched
            and not deployment.busy
            and not deployment.loading
            and not self.manager.has_work(name)
            and name not in self.fetches
        )

    def _progress_from(self, name: str) -> Callable[[int, int], None]:
        """A progress callback for the download thread: whole percents hop to the loop."""
        fetch = self.fetches[name]

        def progress(done: int, total: int) -> None:
            percent = 100 if total <= 0 else min(100, done * 100 // total)
            if percent != fetch.percent:
                fetch.percent = percent
                try:
                    self._loop.call_soon_threadsafe(self._show, name, percent, total)
                except RuntimeError:
                    pass  # the loop is closed: the server is stopping

        return progress

    def _show(self, name: str, percent: int, total: int) -> None:
        deployment = self.manager.deployments.get(name)
        if deployment is None:
            return
        deployment.note = f"Downloading {deployment.spec.repo_id}: {percent}% of {format_size(total)}"
        self._on_progress(name)

    def _fail(self, name: str, reason: str) -> None:
        self.fetches.pop(name, None)
        log.warning("could not fetch %s: %s", name, reason)
        self._on_failed(name, reason)
        self.manager.remove(name)

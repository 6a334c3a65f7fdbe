"""`Server`: every part of a running API process that a route may reach.

The composition root (`app.create_app`) builds one in the app's lifespan and
puts it on ``app.state``; routes reach it through `deps.server_of`. It holds
only what routes use, each part already built: a route never builds a part,
never reaches the controller itself (that is `JobFront`'s link), and never
asks whether a part exists.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..auth.access import Access
from ..auth.accounts import Accounts
from ..auth.keys import KeyStore
from ..config import Settings
from ..front.jobs import JobFront
from ..jobs.bus import EventBus
from ..models.catalog import Catalog
from ..storage.links import LinkSigner
from ..storage.results import ResultStore
from ..telemetry.metrics import Metrics


@dataclass
class Server:
    settings: Settings
    catalog: Catalog
    keys: KeyStore
    bus: EventBus
    results: ResultStore
    signer: LinkSigner
    jobs: JobFront
    access: Access
    accounts: Accounts
    metrics: Metrics

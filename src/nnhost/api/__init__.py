"""The HTTP side: every route, the client's protocols, the pages. It never runs user code.

Runs in every ``nnhost serve`` process with the API role. `server` holds every
part a route may reach; the routes reach the job service only through it
(`front.jobs`), whether the controller is in this process or another.

May import: `front`, `auth`, `jobs`, `models`, `storage`, `telemetry`, `web`,
the vocabulary of `replicas` (`replicas.contract`), and the top-level
modules (`config`, `wire`, `client_versions`, `runtimes`, `units`).
"""

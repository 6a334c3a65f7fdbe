"""The one process that decides: which job runs where, which model is up, and what is recorded.

Runs in the process holding the controller lease (`lease`): the job side
(`loop`, `service`, `scheduler`, `completion`, `recorder`, ...) and the
deployment side (`manager`, `placement`, `scaling`, `on_demand`, ...). It
knows nothing of HTTP.

May import: `replicas`, `execution` (its vocabulary: events, policy), `jobs`,
`models`, `storage`, `db`, `telemetry`, and the top-level modules (`config`,
`units`).
"""

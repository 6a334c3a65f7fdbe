"""One job's own process: the only place a user's request runs.

`process` is its life: forked ahead of time, its layers applied
(`os_layer.job_layers`), it takes a job, reads it (`unpickling`), runs it
(`runner`), captures its ``print()`` output (`capture`), meters its memory
(`memory_meter`), writes its result (`result_writing`, `made_classes`) or
the user's own traceback (`tracebacks`), and exits or parks for its owner's
next job. `warm_up` runs the server's own request through the same path
before any fork.

May import: the shared vocabulary, `guard`, `unpickling`, `weights`,
`os_layer` and `python_layer`. Never `host`: the trusted side imports the
job's code, not the other way round.
"""

"""The trusted long-lived processes of a replica: they hold the weights and never run user code.

`host` loads the model once (`worker`), places and secures it, and forks a
job's process (the fork design) or starts `template`, the process every
job's process of the mapped design is forked from, which maps the host's
weights and holds none of its own. `parked` is their side of a job's
process that waits, stopped, for its owner's next job.

May import: the shared vocabulary, `job` (the code a forked child runs),
`weights`, `guard`, `unpickling`, `os_layer` and `python_layer`.
"""

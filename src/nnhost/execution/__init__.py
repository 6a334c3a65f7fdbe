"""The worker side: where a request's code runs, and the processes that hold the weights.

Nothing here knows of HTTP, the job service or the database (tests/test_import_graph.py
checks that no module here imports them). The folder is split by the process
that runs the code and by the layer of containment it is; the arrows point
inward, from the processes to the layers:

* the shared vocabulary, at this level: `messages` (every message between a
  replica and its processes, as a declared type), `events` (what a job
  reports), `channel` (the packets they travel in), `handoff` (a job's files,
  handed over), `policy` (what the operator configured, as the processes need
  it) and `nnsight_api` (what differs between the nnsight versions a job runs);
* `host` — the trusted long-lived processes: the host that loads the weights,
  the template job processes are forked from, and their side of a parked job;
* `job` — one job's own process: it reads the request, runs it, writes its
  result and its output, and exits;
* `weights` — the weights in memory: read-only on the CPU, mapped into other
  processes, and device memory that crosses processes by descriptor;
* `os_layer` — containment by the kernel: namespaces, the filesystem, the
  seccomp filter, control groups;
* `python_layer` — containment in Python: the sandbox's rules and guarded
  builtins, and allowed libraries' string evaluators closed;
* `unpickling` — reading a request without letting it run anything on the way in;
* `guard` — what keeps one process's jobs from seeing each other's traces:
  the model, process-wide state and fresh memory, checked and put back.

May import: `models` (the catalog's model keys, adapters' files), and the
top-level modules (`client_versions`, `runtimes`, `units`). Within, each
sub-package's docstring says which of its siblings it may import.
"""

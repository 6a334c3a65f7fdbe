"""Containment by the operating system: what still holds when the Python layer is beaten.

`containment` applies the process-wide layers (namespaces, limits, no new
privileges) under a `containment_policy`; `job_layers` adds each job's own on
top of its parent's: `filesystem` (what a job can see and write), the
`syscall_filter` (seccomp) and `cgroups` (memory and task limits). `libc`
holds the Linux calls Python's ``os`` lacks.

May import: nothing else of execution/ (nothing here knows what a job is).
"""

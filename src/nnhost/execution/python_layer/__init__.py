"""Containment in Python: what user code may import, name and call while it runs.

`sandbox_rules` holds the rules as data; `sandbox` applies them to sources
(`check_source`) and at run time (the guarded builtins); `library_hardening`
routes allowed libraries' string evaluators through the same checks.

May import: nothing else of execution/.
"""

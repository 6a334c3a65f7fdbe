"""What keeps the jobs one process runs from seeing each other: checked and put back after each.

`integrity` guards the shared model (its attributes, `attribute_snapshots`;
its weights' checksum) and reports in a `report`; `process_state` puts back
process-wide settings and ends child processes; `fresh_memory` makes memory
a request allocates never show an earlier request's values.

May import: the shared vocabulary, `weights` and `python_layer`.
"""

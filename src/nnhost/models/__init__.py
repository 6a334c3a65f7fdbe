"""The models served: the catalog, model keys, sizes, adapters and the tiny test models.

Read by every tier (the front checks requests against the catalog, the
controller deploys it, a job process builds a model from its key); no
process of its own.

May import: the top-level modules (`units`).
"""

"""What the server tells an operator: metrics, and the structured log.

Runs in the API and controller processes; it reads the board, never
changes anything.

May import: `jobs`, and the vocabulary of `replicas` (`replicas.contract`,
`replicas.incidents`).
"""

"""The fault matrix (`make chaos`): the scale-out topology under load while
faults are injected, then a count, from the database and the receivers'
logs, of what was lost, duplicated, stuck or out of order.

Topology (all on loopback, in a scratch directory): a PostgreSQL cluster and
a Redis of its own (so they can be crash-restarted without touching anything
else on the machine), two `serve` nodes behind a round-robin proxy, two
worker processes, and one HTTPS receiver (bench/chaos/receiver.py) with ok,
slow, flaky (500), throttling (429 + Retry-After), timing-out and gone (410)
paths. A supervisor restarts whatever dies.

Load: senders with idempotency keys (direct messages and channel posts;
a retry after any failure reuses the key), inbox readers that acknowledge,
space and inbox webhook subscriptions on every receiver path, MCP push
subscriptions (a 2xx acknowledges), a granted sender whose grant is revoked
again and again (the revocation barrier), and live sockets on each node.

Faults, in a cycle: SIGKILL of a node (at a random moment, and right after a
send committed), of a worker (at a random moment, after its receivers
answered and before it recorded, and inside the record transaction), of the
timer, and of the node running a revocation barrier between its steps;
PostgreSQL crash-restarted; Redis killed and started empty; a worker's
clock jumped past leases and expiries and back. Processes die at exact
points through controlplane.faults, armed per process.

    python -m bench.chaos [--sends 10000] [--faults 30] [--out DIR]

Exit status 1 if any count in the table is not zero.
"""

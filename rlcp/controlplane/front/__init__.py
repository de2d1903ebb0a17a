"""The API front: the controller's public port, in a process of its own.

The controller's work (status polls of every member, operations' fan-outs, the reconciler)
keeps its event loop busy, and every request on that loop waits its turn: with 1,024 workers
under update cycles, `/v1/rl/state` had a p99 of 160-190 ms and even `/healthz` 50-70 ms,
while a process doing nothing else, on the same machine under the same load, answered in
7 ms (bench/load_state.py; docs/performance.md). So the daemon runs two processes:

    front (this package)   the public port: `GET /v1/rl/state` from a replica of the core's
                           document, `/healthz`, and every other request proxied to the core
    core                   the controller (`rlcp.controlplane.assembly`), on a loopback port

    app.py       the front's routes: the state from its replica (`rlcp.core.follow`: ETag polls,
                 and a fresh read after each write), liveness, the proxy
    daemon.py    starts the core, serves the front, stops both
"""

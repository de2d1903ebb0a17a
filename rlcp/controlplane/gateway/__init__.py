"""The inference gateway: the fleet as one endpoint for rollouts, fenced by weight version.

    fence.py    which members may serve now (pure): serving, at an admitted version
    balance.py  which of them takes a request (pure): least outstanding, or a session's worker
    routing.py  the routing table built from the fleet state, and where that state comes from
                (the controller in this process, or a controller followed over HTTP)
    proxy.py    one request through to a worker and back: streaming, failover, error events
    app.py      the gateway's routes, metrics and site on its own port
    __main__.py `python -m rlcp.controlplane.gateway`: a standalone gateway following a controller

It reads only the state document (`FleetState`), in the controller or from afar, so one
code path serves both.
"""

"""The inference gateway: the fleet as one endpoint for rollouts, fenced by weight version.

One request, in the order it meets them:

    app.py        the gateway's routes, the checks on what it reads, its site on its own port
    fleets.py     which fleet's router serves the request's `model`
    routing.py    the table of members inside the fence (`fence.py`, pure), each with what a
                  request to it needs (its flavor's request path: `workerspec.FLAVOR_REQUESTS`),
                  rebuilt only when the fleet state changed (the controller in this process, or
                  one followed over HTTP: `follow.py`)
    proxy.py      the loop: choose, try, apply the verdict; holding while nothing can serve
    balancing/    which member takes it: one Protocol, a policy per module (least load, session
                  affinity), a factory from the settings
    admission.py  members at their admission limit or ejected, left out of the choice
    send.py       one try: the request out, the answer (or stream) back; `pinning.py` for a member
                  reached through a shared frontend (Dynamo); `answers.py` reads what an answer
                  says (version spans, other weights, a refusal, a dead engine)
    upstream.py   the HTTP/1.1 client under `send.py`: a keep-alive pool per worker, httptools
    retry.py      the retry policy as a table: why a try ended, and what follows
    breaker.py    a circuit per worker (outlier ejection), fed each try's verdict
    errors.py     the client's answers when no worker could give one (502, 503)
    views.py      the gateway's section of the state document
    metrics.py    its Prometheus series
    admin.py      a standalone gateway's forwarding of the controller's routes (one URL)
    __main__.py   `python -m rlcp.controlplane.gateway`: a standalone gateway following a controller

It reads only the state document (`FleetState`), in the controller or from afar, so one
code path serves both; it imports no control-plane driver.
"""

"""Envoy as the gateway's data plane, the controller as its control plane (docs/gateway.md).

    fence.py      which endpoints each fleet's cluster has now (pure): the fence's members,
                  each with the version it was admitted at and its worker id as metadata
    xds.py        the ADS server (gRPC, in the controller's loop): EDS per fleet, each Envoy's
                  ACKs, and `publish()`, which operations await before pausing anyone
    bootstrap.py  Envoy's bootstrap (pure): a static listener and route, one EDS cluster per
                  fleet fed over ADS, the upstream filter that stamps each request with the
                  chosen endpoint's version, retries on a 409 elsewhere, outlier ejection
    local.py      started in the controller's process in place of the Python gateway
    __main__.py   `python -m rlcp.controlplane.gateway.envoy`: one Envoy's bootstrap from the
                  controller's settings (the Helm chart's Envoy pods make theirs with it)

Only `local.py` and `xds.py` import grpc and the generated Envoy API (the `envoy` extra).
"""

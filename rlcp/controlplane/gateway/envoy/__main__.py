"""`python -m rlcp.controlplane.gateway.envoy`: write one Envoy's bootstrap from the controller's
settings (`envoy_bootstrap`), for an Envoy the controller feeds over xDS.

The Helm chart runs it in an init container of each Envoy pod, from the controller's image and
the controller's own config.yaml, so the bootstrap has one maker and cannot drift from the
settings the controller serves the fence by. With a gateway token the bootstrap holds the
tokens inference accepts (Envoy's RBAC compares them): write it where only Envoy reads it.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m rlcp.controlplane.gateway.envoy", description=__doc__)
    parser.add_argument("--config", type=Path, help="the controller's YAML settings file (env RLCP_* overrides it)")
    parser.add_argument(
        "--xds-host", required=True, help="where Envoy reaches the controller's xDS port: an IP address or a DNS name"
    )
    parser.add_argument("--node-id", required=True, help="this Envoy's node id (the controller tracks its ACKs by it)")
    parser.add_argument("--listen-host", default="0.0.0.0", help="address of Envoy's inference listener")
    parser.add_argument("--out", type=Path, required=True, help="the bootstrap file to write (YAML)")
    args = parser.parse_args(argv)

    from rlcp.controlplane.gateway.envoy.bootstrap import envoy_bootstrap
    from rlcp.controlplane.settings import ControllerSettings, load_settings
    from rlcp.core.entry import settings_or_exit

    def check(settings: ControllerSettings) -> None:
        if settings.gateway.data_plane != "envoy":
            raise ValueError("gateway.data_plane is not envoy: the controller serves no xDS to bootstrap from")
        settings.gateway.resolved_token()  # a token file that cannot be read says so here

    settings = settings_or_exit(parser, lambda: load_settings(args.config), check=check)
    admin_token = None  # accepted for inference only beside a gateway token, as by the Python gateway
    if settings.gateway.resolved_token() and settings.gateway.accept_admin_token:
        try:
            admin_token = settings.api.resolved_token()
        except (ValueError, OSError) as exc:
            parser.exit(2, f"{parser.prog}: bad settings: {exc}\n")

    import yaml

    boot = envoy_bootstrap(
        settings,
        xds_host=args.xds_host,
        xds_port=settings.gateway.envoy.xds_port,
        node_id=args.node_id,
        listen_host=args.listen_host,
        admin_token=admin_token,
    )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(yaml.safe_dump(boot, sort_keys=False))
    print(
        f"wrote {args.out} (node {args.node_id}, xDS at {args.xds_host}:{settings.gateway.envoy.xds_port})",
        file=sys.stderr,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

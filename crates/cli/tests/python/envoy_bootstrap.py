"""Checks an Envoy bootstrap (deploy/envoy/envoy.yaml, given as JSON on standard input) against
Envoy's own protos (the `xds-protos` package), as Envoy reads it: YAML to JSON to
`envoy.config.bootstrap.v3.Bootstrap`, every `typed_config` resolved by its `@type`, and no field
that Envoy would not know.

    python envoy_bootstrap.py < envoy.json

Prints the message's summary and exits 0, or what is wrong and exits 1 (2 for missing modules).
"""

import json
import sys

try:
    from envoy.config.bootstrap.v3 import bootstrap_pb2

    # The `@type`s a bootstrap of ours may name: imported so that their descriptors are known.
    from envoy.extensions.filters.http.ratelimit.v3 import rate_limit_pb2  # noqa: F401
    from envoy.extensions.filters.http.router.v3 import router_pb2  # noqa: F401
    from envoy.extensions.filters.network.http_connection_manager.v3 import http_connection_manager_pb2 as hcm
    from envoy.extensions.upstreams.http.v3 import http_protocol_options_pb2  # noqa: F401
    from google.protobuf import json_format
except ImportError as e:  # pragma: no cover - the environment is the test's to provide
    print(f"missing Python module ({e}); run `bash scripts/test.sh`, which installs them", file=sys.stderr)
    sys.exit(2)


def main():
    document = json.load(sys.stdin)
    bootstrap = bootstrap_pb2.Bootstrap()
    try:
        json_format.ParseDict(document, bootstrap)
    except json_format.ParseError as e:
        print(f"FAIL not a valid envoy.config.bootstrap.v3.Bootstrap: {e}")
        return 1
    filters = []
    for listener in bootstrap.static_resources.listeners:
        for chain in listener.filter_chains:
            for network_filter in chain.filters:
                if network_filter.typed_config.Is(hcm.HttpConnectionManager.DESCRIPTOR):
                    manager = hcm.HttpConnectionManager()
                    network_filter.typed_config.Unpack(manager)
                    for http_filter in manager.http_filters:
                        filters.append(f"{http_filter.name} ({http_filter.typed_config.type_url.rsplit('/', 1)[-1]})")
    clusters = [c.name for c in bootstrap.static_resources.clusters]
    print(f"ok   a valid Bootstrap: http filters {filters}, clusters {clusters}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

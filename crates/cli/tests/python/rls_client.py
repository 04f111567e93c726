"""A client of Envoy's rate-limit service built from Envoy's own protos (the `xds-protos` package:
`envoy.service.ratelimit.v3.rls_pb2` and `rls_pb2_grpc`) and gRPC's health checking, run against a
real `tollgate serve`.

    python rls_client.py HOST:PORT --tag TAG [--suite examples|deploy]

`examples` expects the configuration in `config/` beside this file (envoyproxy/ratelimit's README
examples); `deploy` expects `deploy/envoy/ratelimit.yaml` and sends the descriptors that
`deploy/envoy/envoy.yaml`'s rate-limit actions make. TAG goes into every descriptor value that
the configuration counts per value, so that each run counts on keys of its own.

Prints one line per check; on the first failure prints what was expected and what came, and exits
with status 1 (2 for a bad command line or missing modules).
"""

import argparse
import sys
import time

try:
    import grpc
    from envoy.extensions.common.ratelimit.v3 import ratelimit_pb2
    from envoy.service.ratelimit.v3 import rls_pb2, rls_pb2_grpc
    from envoy.type.v3 import ratelimit_unit_pb2
    from google.protobuf import text_format, wrappers_pb2
    from grpc_health.v1 import health_pb2, health_pb2_grpc
except ImportError as e:  # pragma: no cover - the environment is the test's to provide
    print(f"missing Python module ({e}); run `bash scripts/test.sh`, which installs them", file=sys.stderr)
    sys.exit(2)

Response = rls_pb2.RateLimitResponse
MAX_U32 = 2**32 - 1
SERVICE = "envoy.service.ratelimit.v3.RateLimitService"
UNIT_SECONDS = {"SECOND": 1, "MINUTE": 60, "HOUR": 3600, "DAY": 86400, "WEEK": 7 * 86400, "MONTH": 30 * 86400}


class CheckFailed(Exception):
    """A check that did not hold: its message says what was expected and what came."""


def descriptor(*entries, hits=None, limit=None):
    """A RateLimitDescriptor of (key, value) entries; `hits` sets its own hits_addend (a
    google.protobuf.UInt64Value, field 3; 0 included), `limit` = (requests_per_unit, unit name)
    its override."""
    d = ratelimit_pb2.RateLimitDescriptor(
        entries=[ratelimit_pb2.RateLimitDescriptor.Entry(key=k, value=v) for k, v in entries]
    )
    if hits is not None:
        d.hits_addend.CopyFrom(wrappers_pb2.UInt64Value(value=hits))
    if limit is not None:
        requests, unit = limit
        d.limit.CopyFrom(
            ratelimit_pb2.RateLimitDescriptor.RateLimitOverride(
                requests_per_unit=requests, unit=ratelimit_unit_pb2.RateLimitUnit.Value(unit)
            )
        )
    return d


def shown_limit(status):
    """`5/DAY`, `5/DAY name`, or None without a current_limit."""
    if not status.HasField("current_limit"):
        return None
    limit = status.current_limit
    text = f"{limit.requests_per_unit}/{Response.RateLimit.Unit.Name(limit.unit)}"
    return f"{text} {limit.name}" if limit.name else text


def shape(response):
    """The response as (overall code, [(code, limit_remaining, current limit)]), for comparing."""
    statuses = [(Response.Code.Name(s.code), s.limit_remaining, shown_limit(s)) for s in response.statuses]
    return (Response.Code.Name(response.overall_code), statuses)


def one_line(message):
    return text_format.MessageToString(message, as_one_line=True) or "(empty)"


class Client:
    def __init__(self, address, tag):
        self.channel = grpc.insecure_channel(address)
        try:
            grpc.channel_ready_future(self.channel).result(timeout=10)
        except grpc.FutureTimeoutError:
            raise CheckFailed(f"connect to {address}: expected a gRPC server, got none within 10s")
        self.rls = rls_pb2_grpc.RateLimitServiceStub(self.channel)
        self.health = health_pb2_grpc.HealthStub(self.channel)
        self.tag = tag
        self.checks = 0

    def passed(self, what, detail):
        self.checks += 1
        print(f"ok   {what}: {detail}", flush=True)

    def call(self, domain, descriptors, hits=0):
        request = rls_pb2.RateLimitRequest(domain=domain, descriptors=descriptors, hits_addend=hits)
        try:
            return request, self.rls.ShouldRateLimit(request, timeout=10)
        except grpc.RpcError as e:
            raise CheckFailed(f"{one_line(request)}: expected a response, got {e.code().name}: {e.details()}")

    def expect(self, what, domain, descriptors, overall, statuses, hits=0):
        """Asks, and checks the overall code and each status's (code, limit_remaining, limit)."""
        request, response = self.call(domain, descriptors, hits)
        want = (overall, statuses)
        got = shape(response)
        if got != want:
            raise CheckFailed(
                f"{what}\n  request:  {one_line(request)}\n  expected: {want}\n  got:      {got}"
                f"\n  response: {one_line(response)}"
            )
        check_resets(what, response)
        self.passed(what, f"{overall} {statuses}")
        return response

    def expect_error(self, what, domain, descriptors, code):
        request = rls_pb2.RateLimitRequest(domain=domain, descriptors=descriptors)
        try:
            response = self.rls.ShouldRateLimit(request, timeout=10)
        except grpc.RpcError as e:
            if e.code() != code:
                raise CheckFailed(
                    f"{what}\n  request:  {one_line(request)}\n  expected: {code.name}\n"
                    f"  got:      {e.code().name}: {e.details()}"
                )
            self.passed(what, f"{e.code().name} ({e.details()})")
            return
        raise CheckFailed(
            f"{what}\n  request:  {one_line(request)}\n  expected: {code.name}\n  got:      {one_line(response)}"
        )

    def expect_serving(self, service):
        what = f"grpc.health.v1 Check {service!r}"
        try:
            reply = self.health.Check(health_pb2.HealthCheckRequest(service=service), timeout=10)
        except grpc.RpcError as e:
            raise CheckFailed(f"{what}: expected SERVING, got {e.code().name}: {e.details()}")
        status = health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)
        if status != "SERVING":
            raise CheckFailed(f"{what}: expected SERVING, got {status}")
        self.passed(what, status)


def check_resets(what, response):
    """Each counted limit says when its window resets: within one unit, and after 0 once the
    window holds anything. (envoyproxy/ratelimit always says the time to the end of the unit's
    window; tollgate says 0 for a window nothing was counted in, e.g. answering a check that
    counts nothing on a fresh key.)"""
    for i, status in enumerate(response.statuses):
        limit = status.current_limit
        if not status.HasField("current_limit") or limit.requests_per_unit == 0:
            continue
        unit = Response.RateLimit.Unit.Name(limit.unit)
        reset = status.duration_until_reset
        seconds = reset.seconds + reset.nanos / 1e9
        counted = status.limit_remaining < limit.requests_per_unit
        within = (0 < seconds if counted else 0 <= seconds) and seconds <= UNIT_SECONDS[unit]
        if not status.HasField("duration_until_reset") or not within:
            bounds = f"(0, {UNIT_SECONDS[unit]}s]" if counted else f"[0, {UNIT_SECONDS[unit]}s]"
            raise CheckFailed(
                f"{what}: status {i}: expected a duration_until_reset in {bounds}, got {one_line(status)}"
            )


def settle(unit_seconds, margin):
    """Waits for the next window of `unit_seconds` when the current one ends within `margin`
    seconds: the checks count exact remainders, which a window turning mid-run would reset.
    Windows are aligned to the Unix epoch (envoyproxy/ratelimit's and tollgate's fixed windows)."""
    left = unit_seconds - time.time() % unit_seconds
    if left < margin:
        print(f"waiting {left:.1f}s for the next {unit_seconds}s window to begin", flush=True)
        time.sleep(left + 0.05)


# ---------------------------------------------------------------------------------------------
# The `examples` suite: config/*.yaml, envoyproxy/ratelimit's README examples.


def health(c):
    c.expect_serving("")
    c.expect_serving(SERVICE)


def nested_descriptors(c):
    """Example 2: (message_type, marketing), (to_number, N) 5 a day per number; (to_number, N)
    100 a day. One request with both descriptors counts on both."""
    number = f"+1206-{c.tag}"
    marketing = lambda n: descriptor(("message_type", "marketing"), ("to_number", n))  # noqa: E731
    any_message = lambda n: descriptor(("to_number", n))  # noqa: E731
    for i in range(5):
        c.expect(
            f"nested: marketing message {i + 1} of 5 to one number",
            "messaging",
            [marketing(number), any_message(number)],
            "OK",
            [("OK", 4 - i, "5/DAY"), ("OK", 99 - i, "100/DAY")],
        )
    c.expect(
        "nested: the 6th marketing message is over its 5 a day",
        "messaging",
        [marketing(number), any_message(number)],
        "OVER_LIMIT",
        [("OVER_LIMIT", 0, "5/DAY"), ("OK", 95, "100/DAY")],
    )
    c.expect(
        "nested: another number has its own 5",
        "messaging",
        [marketing(number + "-2"), any_message(number + "-2")],
        "OK",
        [("OK", 4, "5/DAY"), ("OK", 99, "100/DAY")],
    )
    c.expect(
        "nested: (message_type, marketing) alone is a placeholder, no limit",
        "messaging",
        [descriptor(("message_type", "marketing"))],
        "OK",
        [("OK", 0, None)],
    )
    c.expect(
        "nested: another message_type matches nothing",
        "messaging",
        [descriptor(("message_type", "transactional"), ("to_number", number))],
        "OK",
        [("OK", 0, None)],
    )
    c.expect(
        "nested: more entries than the config's levels match nothing (example 4)",
        "messaging",
        [descriptor(("to_number", number), ("carrier", "x"))],
        "OK",
        [("OK", 0, None)],
    )


def all_or_nothing(c):
    """tollgate's deliberate difference: a request refused by one descriptor consumes nothing from
    its others (envoyproxy/ratelimit would count them all). Both orders, so that on a cluster the
    refusing key's slot comes before and after the admitting one's."""
    number = f"+1555-{c.tag}"
    marketing = descriptor(("message_type", "marketing"), ("to_number", number))
    any_message = descriptor(("to_number", number))
    for i in range(5):
        c.expect(
            f"all-or-nothing: marketing message {i + 1} of 5",
            "messaging",
            [marketing, any_message],
            "OK",
            [("OK", 4 - i, "5/DAY"), ("OK", 99 - i, "100/DAY")],
        )
    for n in range(3):
        c.expect(
            f"all-or-nothing: refused request {n + 1} (refusing descriptor first) takes nothing from its sibling",
            "messaging",
            [marketing, any_message],
            "OVER_LIMIT",
            [("OVER_LIMIT", 0, "5/DAY"), ("OK", 95, "100/DAY")],
        )
        c.expect(
            f"all-or-nothing: refused request {n + 1} (refusing descriptor last) takes nothing from its sibling",
            "messaging",
            [any_message, marketing],
            "OVER_LIMIT",
            [("OK", 95, "100/DAY"), ("OVER_LIMIT", 0, "5/DAY")],
        )
    c.expect(
        "all-or-nothing: the sibling alone counts from 95 (envoyproxy/ratelimit counts refused requests too: 88)",
        "messaging",
        [any_message],
        "OK",
        [("OK", 94, "100/DAY")],
    )
    address = f"{c.tag}-198.51.100.7"
    c.expect(
        "all-or-nothing: a blocklisted descriptor refuses the request, its sibling is not counted",
        "edge_proxy_per_ip",
        [descriptor(("remote_address", address)), descriptor(("remote_address", "50.0.0.5"))],
        "OVER_LIMIT",
        [("OK", 10, "10/HOUR"), ("OVER_LIMIT", 0, "0/SECOND")],
    )
    c.expect(
        "all-or-nothing: the sibling alone then counts its first request",
        "edge_proxy_per_ip",
        [descriptor(("remote_address", address))],
        "OK",
        [("OK", 9, "10/HOUR")],
    )


def blocklist(c):
    """Example 3: 10 an hour per address, none for 50.0.0.5 (`requests_per_unit: 0`)."""
    address = f"{c.tag}-50.0.0.1"
    for i in range(2):
        c.expect(
            f"blocklist: an ordinary address, request {i + 1}",
            "edge_proxy_per_ip",
            [descriptor(("remote_address", address))],
            "OK",
            [("OK", 9 - i, "10/HOUR")],
        )
    for i in range(2):
        c.expect(
            f"blocklist: 50.0.0.5 is always over (request {i + 1})",
            "edge_proxy_per_ip",
            [descriptor(("remote_address", "50.0.0.5"))],
            "OVER_LIMIT",
            [("OVER_LIMIT", 0, "0/SECOND")],
        )


def hits_addend(c):
    """The request's hits_addend counts that many on every descriptor; a descriptor's own
    hits_addend (UInt64Value) overrides it, 0 included (a check that counts nothing)."""
    address = f"{c.tag}-198.51.100.1"
    edge = "edge_proxy_per_ip"
    c.expect("hits_addend: request-level 3", edge, [descriptor(("remote_address", address))], "OK",
             [("OK", 7, "10/HOUR")], hits=3)
    c.expect("hits_addend: descriptor-level 2 overrides the request's 3", edge,
             [descriptor(("remote_address", address), hits=2)], "OK", [("OK", 5, "10/HOUR")], hits=3)
    c.expect("hits_addend: descriptor-level 0 checks without counting", edge,
             [descriptor(("remote_address", address), hits=0)], "OK", [("OK", 5, "10/HOUR")], hits=3)
    c.expect("hits_addend: request-level 0 means 1", edge, [descriptor(("remote_address", address))], "OK",
             [("OK", 4, "10/HOUR")], hits=0)
    c.expect("hits_addend: request-level 4 takes all that is left", edge,
             [descriptor(("remote_address", address))], "OK", [("OK", 0, "10/HOUR")], hits=4)
    c.expect("hits_addend: then 1 more is over", edge, [descriptor(("remote_address", address))], "OVER_LIMIT",
             [("OVER_LIMIT", 0, "10/HOUR")])
    c.expect("hits_addend: descriptor-level 0 on a spent limit is still OK", edge,
             [descriptor(("remote_address", address), hits=0)], "OK", [("OK", 0, "10/HOUR")])
    one, two = f"{c.tag}-198.51.100.2", f"{c.tag}-198.51.100.3"
    c.expect("hits_addend: each descriptor its own (4, and the request's 2)", edge,
             [descriptor(("remote_address", one), hits=4), descriptor(("remote_address", two))], "OK",
             [("OK", 6, "10/HOUR"), ("OK", 8, "10/HOUR")], hits=2)


def limit_override(c):
    """A descriptor's `limit` replaces its configured limit (and applies where none is configured,
    in a configured domain)."""
    address = f"{c.tag}-198.51.100.4"
    edge = "edge_proxy_per_ip"
    for remaining in (1, 0):
        c.expect(f"limit override: 2/HOUR instead of 10/HOUR, {remaining} left", edge,
                 [descriptor(("remote_address", address), limit=(2, "HOUR"))], "OK", [("OK", remaining, "2/HOUR")])
    c.expect("limit override: the 3rd is over", edge, [descriptor(("remote_address", address), limit=(2, "HOUR"))],
             "OVER_LIMIT", [("OVER_LIMIT", 0, "2/HOUR")])
    custom = ("tenant", f"{c.tag}-acme")
    c.expect("limit override: on a descriptor the config lacks", edge, [descriptor(custom, limit=(1, "DAY"))], "OK",
             [("OK", 0, "1/DAY")])
    c.expect("limit override: ... and enforced there", edge, [descriptor(custom, limit=(1, "DAY"))], "OVER_LIMIT",
             [("OVER_LIMIT", 0, "1/DAY")])
    c.expect("limit override: ignored in an unknown domain", f"nowhere-{c.tag}",
             [descriptor(custom, limit=(1, "DAY"))], "OK", [("OK", 0, None)])


def wildcards(c):
    """Example 9: `/foo/baz*` counts each value on its own; `/shared/*` with share_threshold
    counts its values together; an exact value matches only itself."""
    client = ("client", c.tag)
    d = lambda path: descriptor(client, ("path", path))  # noqa: E731
    for remaining in (2, 1, 0):
        c.expect(f"wildcard: /foo/baz/1 matches /foo/baz*, {remaining} left", "example9", [d("/foo/baz/1")], "OK",
                 [("OK", remaining, "3/HOUR")])
    c.expect("wildcard: /foo/baz/1's 4th is over", "example9", [d("/foo/baz/1")], "OVER_LIMIT",
             [("OVER_LIMIT", 0, "3/HOUR")])
    c.expect("wildcard: /foo/baz/2 counts on its own", "example9", [d("/foo/baz/2")], "OK", [("OK", 2, "3/HOUR")])
    c.expect("wildcard: /foo/bazooka matches too", "example9", [d("/foo/bazooka")], "OK", [("OK", 2, "3/HOUR")])
    c.expect("wildcard: /foo/ba does not", "example9", [d("/foo/ba")], "OK", [("OK", 0, None)])
    c.expect("wildcard: the exact /foo/bar", "example9", [d("/foo/bar")], "OK", [("OK", 19, "20/HOUR")])
    c.expect("wildcard: /foo/bar/x is not /foo/bar", "example9", [d("/foo/bar/x")], "OK", [("OK", 0, None)])
    for path, remaining in (("/shared/a", 2), ("/shared/b", 1), ("/shared/c", 0)):
        c.expect(f"wildcard: share_threshold, {path} counts with the others", "example9", [d(path)], "OK",
                 [("OK", remaining, "3/HOUR")])
    c.expect("wildcard: share_threshold, /shared/d is over", "example9", [d("/shared/d")], "OVER_LIMIT",
             [("OVER_LIMIT", 0, "3/HOUR")])


def replaces(c):
    """Example 7: a request with both descriptors gets only the 10 an hour, and leaves the replaced
    `specific_limit` (5 an hour) untouched."""
    user = ("user", f"{c.tag}-bkthomps")
    one = descriptor(("key_1", "value_1"), user)
    two = descriptor(("key_2", "value_2"), user)
    c.expect("replaces: (key_1, value_1), (user, U) alone: 5/HOUR specific_limit", "example7", [one], "OK",
             [("OK", 4, "5/HOUR specific_limit")])
    c.expect("replaces: with (key_2, value_2), (user, U), only the 10/HOUR applies", "example7", [one, two], "OK",
             [("OK", 0, None), ("OK", 9, "10/HOUR")])
    c.expect("replaces: the replaced limit was not counted", "example7", [one], "OK",
             [("OK", 3, "5/HOUR specific_limit")])
    c.expect("replaces: (key_2, value_2), (user, U) alone", "example7", [two], "OK", [("OK", 8, "10/HOUR")])


def shadow_mode(c):
    """Example 6: user-a's limit is in shadow mode (never refuses), user-b's is enforced."""
    service = ("service", f"{c.tag}-auth")
    a = descriptor(service, ("user", "user-a"))
    b = descriptor(service, ("user", "user-b"))
    for i, remaining in enumerate((1, 0, 0, 0)):
        c.expect(f"shadow_mode: user-a request {i + 1} of a 2/HOUR limit is OK", "example6", [a], "OK",
                 [("OK", remaining, "2/HOUR")])
    for remaining in (1, 0):
        c.expect(f"shadow_mode: user-b is enforced, {remaining} left", "example6", [b], "OK",
                 [("OK", remaining, "2/HOUR")])
    c.expect("shadow_mode: user-b's 3rd is over", "example6", [b], "OVER_LIMIT", [("OVER_LIMIT", 0, "2/HOUR")])
    other = ("service", f"{c.tag}-billing")
    a2, b2 = descriptor(other, ("user", "user-a")), descriptor(other, ("user", "user-b"))
    c.expect("shadow_mode: beside an enforced limit, both counted", "example6", [a2, b2], "OK",
             [("OK", 1, "2/HOUR"), ("OK", 1, "2/HOUR")])
    c.expect("shadow_mode: beside an enforced limit, both counted again", "example6", [a2, b2], "OK", [("OK", 0, "2/HOUR"), ("OK", 0, "2/HOUR")])
    c.expect("shadow_mode: over both, only the enforced one refuses", "example6", [a2, b2], "OVER_LIMIT",
             [("OK", 0, "2/HOUR"), ("OVER_LIMIT", 0, "2/HOUR")])
    third = ("service", f"{c.tag}-search")
    a3, b3 = descriptor(third, ("user", "user-a")), descriptor(third, ("user", "user-b"))
    c.expect("shadow_mode: user-b spent alone", "example6", [b3], "OK", [("OK", 0, "2/HOUR")], hits=2)
    c.expect("shadow_mode: a refused request does not count its shadow-mode descriptor", "example6", [a3, b3],
             "OVER_LIMIT", [("OK", 2, "2/HOUR"), ("OVER_LIMIT", 0, "2/HOUR")])
    c.expect("shadow_mode: ... which still has its 2", "example6", [a3], "OK", [("OK", 1, "2/HOUR")])


def unlimited(c):
    """Example 5: `unlimited: true` is OK with limit_remaining MaxUint32 and no current_limit."""
    ldap = descriptor(("ldap", c.tag))
    azure = descriptor(("azure", c.tag))
    for i in range(3):
        c.expect(f"unlimited: ldap request {i + 1}", "internal", [ldap], "OK", [("OK", MAX_U32, None)])
    c.expect("unlimited: azure is limited", "internal", [azure], "OK", [("OK", 99, "100/HOUR")])
    c.expect("unlimited: both in one request", "internal", [ldap, azure], "OK",
             [("OK", MAX_U32, None), ("OK", 98, "100/HOUR")])


def domains(c):
    c.expect("unknown domain: OK, no current_limit", f"no-such-domain-{c.tag}", [descriptor(("a", "b"))], "OK",
             [("OK", 0, None)])
    c.expect("unknown descriptor in a known domain: OK, no current_limit", "internal",
             [descriptor(("nothing", "here"))], "OK", [("OK", 0, None)])
    c.expect_error("empty domain", "", [descriptor(("remote_address", "x"))], grpc.StatusCode.INVALID_ARGUMENT)
    c.expect_error("no descriptors", "messaging", [], grpc.StatusCode.INVALID_ARGUMENT)


def hour_window(c):
    """Every counted limit of config/ is per hour or per day (days begin on an hour)."""
    settle(3600, margin=30)


EXAMPLES = [
    hour_window,
    health,
    nested_descriptors,
    blocklist,
    wildcards,
    replaces,
    shadow_mode,
    unlimited,
    hits_addend,
    limit_override,
    domains,
    all_or_nothing,
]

# ---------------------------------------------------------------------------------------------
# The `deploy` suite: deploy/envoy/ratelimit.yaml, asked what deploy/envoy/envoy.yaml's
# rate-limit actions send (domain `edge`).


def deploy(c):
    settle(60, margin=5)
    health(c)
    address = f"{c.tag}.example"
    c.expect("deploy: / (remote_address)", "edge", [descriptor(("remote_address", address))], "OK",
             [("OK", 299, "300/MINUTE")])
    c.expect("deploy: / from the blocked address", "edge", [descriptor(("remote_address", "192.0.2.66"))],
             "OVER_LIMIT", [("OVER_LIMIT", 0, "0/SECOND")])
    address = f"{c.tag}.login.example"
    login = [
        descriptor(("remote_address", address)),
        descriptor(("generic_key", "login"), ("remote_address", address)),
    ]
    for i in range(5):
        c.expect(f"deploy: /login attempt {i + 1}", "edge", login, "OK",
                 [("OK", 299 - i, "300/MINUTE"), ("OK", 4 - i, "5/MINUTE")])
    c.expect("deploy: /login attempt 6 is refused, and counted nowhere", "edge", login, "OVER_LIMIT",
             [("OK", 295, "300/MINUTE"), ("OVER_LIMIT", 0, "5/MINUTE")])
    address = f"{c.tag}.api.example"
    api = lambda key: [descriptor(("remote_address", address)), descriptor(("api_key", key))]  # noqa: E731
    c.expect("deploy: /api with an API key", "edge", api(f"{c.tag}-key"), "OK",
             [("OK", 299, "300/MINUTE"), ("OK", 999, "1000/MINUTE")])
    c.expect("deploy: /api with the internal batch key (unlimited)", "edge", api("internal-batch"), "OK",
             [("OK", 298, "300/MINUTE"), ("OK", MAX_U32, None)])
    c.expect("deploy: /api with a trial key (shadow_mode)", "edge", api(f"trial-{c.tag}"), "OK",
             [("OK", 297, "300/MINUTE"), ("OK", 99, "100/HOUR")])


SUITES = {"examples": EXAMPLES, "deploy": [deploy]}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("address", help="tollgate's gRPC address, HOST:PORT")
    parser.add_argument("--tag", required=True, help="put into counted descriptor values: fresh keys per run")
    parser.add_argument("--suite", choices=sorted(SUITES), default="examples")
    args = parser.parse_args()
    try:
        client = Client(args.address, args.tag)
        for scenario in SUITES[args.suite]:
            scenario(client)
    except CheckFailed as failure:
        print(f"FAIL {failure}", flush=True)
        return 1
    print(f"{client.checks} checks passed ({args.suite}, {args.address})", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

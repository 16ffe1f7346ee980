"""`kcm operator`: run the Kubernetes operator that keeps ClientMetricsSubscriptions in Kafka."""

from __future__ import annotations

import argparse
import ipaddress
import logging
import os
import random
import re
import secrets
import socket
import threading
import urllib.parse
from collections.abc import Callable

from kcm_cli.arguments import kafka_connection, seconds_from
from kcm_common.errors import UserError
from kcm_common.names import listen_address_problem

log = logging.getLogger("kcm.operator")

HELP = "run the operator: ClientMetricsSubscription resources → CLIENT_METRICS in Kafka"
DESCRIPTION = ("Watch ClientMetricsSubscription resources (reading the KafkaConnections they name) and keep each "
               "subscription in Kafka as its spec says: differences applied, drift reverted, conflicts reported, "
               "finalizers on delete. Finds the Kubernetes API as kubectl does (in-cluster service account, else "
               "KUBECONFIG).")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    scope = parser.add_mutually_exclusive_group(required=True)
    scope.add_argument("-n", "--namespace", action="append", metavar="NS",
                       help="watch this namespace (repeatable; globs such as 'team-*' allowed)")
    scope.add_argument("-A", "--all-namespaces", action="store_true", help="watch the whole cluster")
    kafka_connection(parser, servers="the default Kafka cluster (resources without spec.connection)",
                     properties="client properties file for TLS/SASL to the default cluster")
    parser.add_argument("--drift-interval", type=seconds_from(1), default=60.0, metavar="SECONDS",
                        help="how often each subscription is compared with Kafka (default 60)")
    parser.add_argument("--metrics-port", type=int, default=9090, metavar="PORT",
                        help="Prometheus metrics on http://ADDRESS:PORT/metrics (0 = off; default 9090)")
    parser.add_argument("--liveness-port", type=int, default=8080, metavar="PORT",
                        help="liveness probe on http://ADDRESS:PORT/healthz (0 = off; default 8080)")
    parser.add_argument("--listen-address", default="0.0.0.0", metavar="ADDRESS",
                        help="IP address the metrics and liveness endpoints listen on (default 0.0.0.0: every "
                             "IPv4 interface, as a pod needs; 127.0.0.1 keeps them local)")
    parser.add_argument("--log-format", choices=("text", "json"), default="text",
                        help="json: one JSON object per line, with the resource's namespace and name")
    parser.add_argument("--standalone", action="store_true",
                        help="no peering with other replicas (default: peer through kopf's KopfPeering if present)")
    parser.add_argument("--peering-name", metavar="NAME",
                        help="peer through the KopfPeering (ClusterKopfPeering with --all-namespaces) of this name, "
                             "and wait until it exists rather than ever reconcile without it (default: kopf's "
                             "'default', and only if kopf's peering CRDs are installed)")
    parser.add_argument("--priority", type=int, metavar="N",
                        help="peering priority; the highest-priority replica works, the rest wait (default: random)")
    # Whole seconds: kopf announces and compares peering lifetimes as integers.
    parser.add_argument("--peering-lifetime", type=int, default=60, metavar="SECONDS",
                        help="how long a silent replica's peering entry counts as alive: a standby takes over that "
                             "long after the working replica died (default 60, kopf's)")


def run(args: argparse.Namespace) -> int:
    """Run until SIGINT/SIGTERM."""
    import kopf
    import prometheus_client
    import yaml

    from kcm_common import strict_yaml
    from kubernetes import client
    from kubernetes import config as kube_config

    from kcm_common.kafka import KafkaSettings
    from kcm_operator.connections import ConnectionResolver, command_config_reader
    from kcm_operator.handlers import HANDLER_THREADS, OperatorConfig, build_registry, operator_settings
    from kcm_operator.kopf_logs import quiet_kopf
    from kcm_common.logs import use_json

    if args.log_format == "json":   # first: every error that ends it is a JSON line too, for the log pipeline
        use_json()
    settings = KafkaSettings.from_cli(args.bootstrap_server, args.command_config)
    if args.peering_name is not None and args.standalone:
        raise UserError("--peering-name and --standalone contradict each other; give one")
    if args.peering_name is not None and not _PEERING_NAME.fullmatch(args.peering_name):
        raise UserError(f"--peering-name {args.peering_name[:80]!r} is not a Kubernetes object name (lowercase "
                        "letters, digits, '-' and '.', at most 253)")
    if not 1 <= args.peering_lifetime <= 86400:   # kopf adds it to a datetime: far beyond a day it overflows
        raise UserError(f"--peering-lifetime must be from 1 second to 86400 (a day), not {args.peering_lifetime}")
    for option in ("metrics_port", "liveness_port"):
        if not 0 <= getattr(args, option) <= 65535:
            raise UserError(f"--{option.replace('_', '-')} must be a port from 0 to 65535")
    if args.metrics_port and args.metrics_port == args.liveness_port:
        raise UserError(f"--metrics-port and --liveness-port are both {args.metrics_port}; give them different ports")
    if problem := listen_address_problem(args.listen_address):
        raise UserError(f"--listen-address {problem}")
    address = ipaddress.ip_address(args.listen_address)
    # kafka-python logs its whole configuration, SASL password included, at DEBUG.
    logging.getLogger("kafka").setLevel(max(logging.WARNING, logging.getLogger("kafka").getEffectiveLevel()))
    quiet_kopf()
    try:
        try:
            kube_config.load_incluster_config()
        except kube_config.ConfigException:
            kube_config.load_kube_config()
    except (kube_config.ConfigException, OSError) as exc:
        raise UserError(
            f"cannot find the Kubernetes API (no in-cluster service account, no kubeconfig): {exc}") from None
    except yaml.YAMLError as exc:
        raise UserError(f"the kubeconfig (KUBECONFIG or ~/.kube/config) is not valid YAML"
                        f"{strict_yaml.describe(exc)}") from None
    except RecursionError:   # PyYAML builds nested values by recursion
        raise UserError("the kubeconfig (KUBECONFIG or ~/.kube/config) nests values too deeply to be read") from None
    except UnicodeDecodeError as exc:
        raise UserError(f"the kubeconfig (KUBECONFIG or ~/.kube/config) is not UTF-8 text (byte {exc.start})") from None
    except ValueError:   # binascii.Error: the kubernetes client decodes the *-data fields as it loads them
        raise UserError("the kubeconfig (KUBECONFIG or ~/.kube/config) holds a value that is not valid base64: check "
                        "certificate-authority-data, client-certificate-data and client-key-data") from None
    except (TypeError, AttributeError, KeyError, IndexError):   # valid YAML, but not a kubeconfig's shape
        raise UserError("the kubeconfig (KUBECONFIG or ~/.kube/config) is not a kubeconfig: it must be a mapping with "
                        "clusters, users, contexts and current-context (kubectl config view shows what it holds)") \
            from None
    server = urllib.parse.urlsplit(client.Configuration.get_default_copy().host or "")
    if server.scheme not in ("http", "https") or not server.hostname:
        # Not quoted: a server written as user:password@host would show its password.
        raise UserError("the kubeconfig's cluster server is not an https:// URL of the Kubernetes API; "
                        "check its current context")
    # Every handler thread may read a KafkaConnection or its Secrets at once: a pooled connection for each (the default
    # keeps 5 a CPU, and urllib3 warns for every connection past them).
    reading = client.Configuration.get_default_copy()
    reading.connection_pool_maxsize = HANDLER_THREADS
    resolver = ConnectionResolver(client.ApiClient(reading))
    operator_config = OperatorConfig(settings, args.drift_interval, resolve=resolver.resolve,
                                     statuses=resolver.statuses,
                                     reload=command_config_reader(args.bootstrap_server, args.command_config, settings),
                                     command_config=args.command_config)
    if args.liveness_port:
        # kopf binds it later, where a failure is a traceback
        _check_free("--liveness-port", address, args.liveness_port)
    if args.metrics_port:
        try:
            prometheus_client.start_http_server(args.metrics_port, addr=str(address))
        except OSError as exc:
            raise UserError(_port_problem("--metrics-port", args.metrics_port, exc)) from None
    kopf_settings = operator_settings()
    # Also what this replica announces: the others give up on it that long after its last keep-alive.
    kopf_settings.peering.lifetime = args.peering_lifetime
    stop = threading.Event()
    threading.Thread(target=_say_if_the_api_is_silent, name="kcm-api-check", daemon=True,
                     args=(operator_config.kubernetes_api_problem, _api_url(server), stop)).start()
    if args.peering_name is not None:
        threading.Thread(target=_warn_while_peering_is_missing, name="kcm-peering-check", daemon=True,
                         args=(args.peering_name, args.namespace or [], args.all_namespaces, stop)).start()
    try:
        kopf.run(
            registry=build_registry(operator_config),
            settings=kopf_settings,
            namespaces=args.namespace or (),
            clusterwide=args.all_namespaces,
            standalone=True if args.standalone else None,
            peering_name=args.peering_name,
            priority=args.priority if args.priority is not None else random.randint(1, 1_000_000),
            liveness_endpoint=_url(address, args.liveness_port, "/healthz") if args.liveness_port else None,
            identity=replica_identity(),
        )
    finally:
        stop.set()
        resolver.close()
    return 0


def _say_if_the_api_is_silent(problem: Callable[[], str | None], url: str, stop: threading.Event) -> None:
    """kopf meets an API server that does not answer with a minute of retries, each a line naming only a request
    path, before it stops: say at once which server and what to check."""
    why = problem()
    if why is not None and not stop.is_set():
        check = ("that the kubeconfig's certificate-authority(-data) is the CA of the API server's certificate and "
                 "that its server name is one the certificate names" if "CERTIFICATE" in why.upper() else
                 "that the API server is up and reachable from here (a proxy, a firewall, a NetworkPolicy) and that "
                 "the kubeconfig's current context names it")
        log.error("the Kubernetes API at %s does not answer (%s): check %s; kopf tries again for about a minute, then "
                  "stops", url, why, check)


def _warn_while_peering_is_missing(name: str, namespaces: list[str], cluster_wide: bool, stop: threading.Event,
                                   first_s: float = 5.0, every_s: float = 60.0) -> None:
    """kopf waits for a named peering object without a word above DEBUG (and the liveness probe stays happy): say
    it, at start and every minute while the object, or kopf's CRD for it, is missing."""
    from kubernetes import client
    from kubernetes.client.rest import ApiException

    api = client.CustomObjectsApi()
    wait = first_s
    while not stop.wait(wait):
        wait = every_s
        # Namespace patterns (kopf's globs, negations and lists) name no single object to look for.
        wanted = ([("ClusterKopfPeering", None)] if cluster_wide else
                  [("KopfPeering", namespace) for namespace in namespaces if not set("*?[!, ") & set(namespace)])
        missing = []
        for kind, namespace in wanted:
            found = None
            for group in ("kopf.dev", "zalando.org"):  # kopf peers through either group's CRDs
                try:
                    if namespace is None:
                        api.get_cluster_custom_object(group, "v1", "clusterkopfpeerings", name, _request_timeout=10)
                    else:
                        api.get_namespaced_custom_object(group, "v1", namespace, "kopfpeerings", name,
                                                         _request_timeout=10)
                    found = True
                except ApiException as exc:
                    # The chart grants kopf.dev only: the API server refuses zalando.org (403) before it looks.
                    if exc.status != 404 and not (exc.status == 403 and group != "kopf.dev"):
                        log.debug("checking the peering object %s: %s %s", name, exc.status, exc.reason)
                        found = True  # not known to be missing
                except Exception as exc:  # the API unreachable: kopf reports that itself
                    log.debug("checking the peering object %s: %s", name, exc)
                    found = True
                if found:
                    break
            if not found:
                missing.append(f"{kind} {namespace}/{name}" if namespace else f"{kind} {name}")
        if missing:
            log.warning("this replica reconciles nothing until its peering object exists: %s not found (create it, "
                        "and install kopf's kopf.dev CRDs first if they are missing; the chart creates it with "
                        "operator.peering.enabled)", ", ".join(missing))


def replica_identity() -> str:
    """How this replica is known to its peers: the pod's name (`POD_ID`, which the chart sets), else host, pid and a
    random part. Not kopf's default, which asks the user database for the process's uid and fails in an image that
    has no entry for it (the chart runs as 10001)."""
    return os.environ.get("POD_ID") or f"{socket.gethostname()}/{os.getpid()}/{secrets.token_hex(3)}"


_PEERING_NAME = re.compile(r"(?=.{1,253}$)[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")


def _check_free(option: str, address: ipaddress.IPv4Address | ipaddress.IPv6Address, port: int) -> None:
    family = socket.AF_INET6 if address.version == 6 else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((str(address), port))
        except OSError as exc:
            raise UserError(_port_problem(option, port, exc)) from None


def _api_url(server: urllib.parse.SplitResult) -> str:
    """The API server's URL as scheme, host and port only: a user name or password written into it stays out."""
    host = f"[{server.hostname}]" if ":" in (server.hostname or "") else server.hostname
    try:
        port = f":{server.port}" if server.port else ""
    except ValueError:   # not a number: said by the error itself
        port = ""
    return f"{server.scheme}://{host}{port}"


def _url(address: ipaddress.IPv4Address | ipaddress.IPv6Address, port: int, path: str) -> str:
    host = f"[{address}]" if address.version == 6 else str(address)
    return f"http://{host}:{port}{path}"


def _port_problem(option: str, port: int, exc: OSError) -> str:
    return f"{option} {port}: cannot listen on it ({exc.strerror or exc}); choose another port, or 0 to turn it off"

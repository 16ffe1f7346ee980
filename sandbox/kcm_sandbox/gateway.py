"""The sandbox's Kafka-protocol gateway: passes every request to the upstream broker, except the KIP-714 APIs and
CLIENT_METRICS configs, which it answers itself like an Apache Kafka broker would."""

from __future__ import annotations

import asyncio
import itertools
import logging
import re
import socket
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from kafka.protocol.admin.configs import AlterConfigsRequest, ListConfigResourcesRequest
from kafka.protocol.admin.topics import DeleteTopicsRequest, DeleteTopicsResponse
from kafka.protocol.metadata import MetadataRequest, MetadataResponse
from kafka.protocol.metadata.api_versions import ApiVersionsRequest, ApiVersionsResponse

from kcm_common import contract
from kcm_common.codes import INVALID_RECORD, INVALID_REQUEST, UNKNOWN_SERVER_ERROR, UNSUPPORTED_VERSION
from kcm_common.pacing import PacedLog
from kcm_sandbox import config_apis, wire
from kcm_sandbox.store import SubscriptionStore
from kcm_sandbox.messages import (
    GetTelemetrySubscriptionsRequest,
    GetTelemetrySubscriptionsResponse,
    PushTelemetryRequest,
    PushTelemetryResponse,
)
from kcm_sandbox.telemetry import (
    UNKNOWN_SOFTWARE,
    ClientIdentity,
    PushResult,
    TelemetryManager,
)

log = logging.getLogger("kcm.sandbox")

# What the gateway itself serves, and the highest version it can read (kafka-python's schemas, or ours).
_LOCAL_VERSIONS = {
    GetTelemetrySubscriptionsRequest.API_KEY: (0, GetTelemetrySubscriptionsRequest.max_version),
    PushTelemetryRequest.API_KEY: (0, PushTelemetryRequest.max_version),
    ListConfigResourcesRequest.API_KEY: (0, ListConfigResourcesRequest.max_version),
    AlterConfigsRequest.API_KEY: (0, AlterConfigsRequest.max_version),
}
# ApiVersionsRequest.SOFTWARE_NAME_VERSION_PATTERN (ASCII only, as Java's classes are).
_SOFTWARE_PATTERN = re.compile(r"[a-zA-Z0-9](?:[a-zA-Z0-9\-.]*[a-zA-Z0-9])?", re.ASCII)
# Config APIs whose CLIENT_METRICS resources the gateway splits off, up to the versions it can parse.
_SPLIT_MAX_VERSIONS = {api_key: request.max_version for api_key, request in config_apis.REQUEST_CLASSES.items()}

Receiver = Callable[[uuid.UUID, ClientIdentity, PushResult], None]

DEFAULT_CONNECTIONS_MAX_IDLE_MS = 600000  # Kafka's connections.max.idle.ms
# Bytes of client frames being read at once; beyond it, frames above 1 MiB wait (see wire.FrameBudget).
DEFAULT_FRAME_BUDGET_BYTES = 128 * 1024 * 1024
# A request that kept the event loop longer than this delays its connection's next one by as long.
_HOLD_S = 0.005
_TOPIC_DELETION_DISABLED = 73  # Kafka's answer for a topic that may not be deleted


@dataclass
class _Client:
    """What the gateway knows of one client connection."""

    connection_id: str
    address: str
    port: int
    client_id: str = ""  # Kafka reads a null client id as ""
    # Kafka's ClientInformation.EMPTY: what a client that never sent ApiVersions v3+ matches as.
    software_name: str = UNKNOWN_SOFTWARE
    software_version: str = UNKNOWN_SOFTWARE
    instance_id: uuid.UUID | None = None

    def identity(self) -> ClientIdentity:
        return ClientIdentity(self.client_id, self.software_name, self.software_version, self.address, self.port)

    def __str__(self) -> str:
        instance = self.instance_id or "-"  # the dashed form, as the metrics topic and `kcm tail` show it
        return f"{self.address}:{self.port} client_id={self.client_id} instance={instance}"


@dataclass
class _Upstream:
    """One connection to the upstream broker; its answers are matched to requests by correlation id."""

    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter
    failed: PacedLog  # "upstream connection failed", paced by the gateway
    pending: dict[int, asyncio.Future[bytes]] = field(default_factory=dict)
    closed: bool = False  # the pump has ended: nothing more will be answered

    async def send(self, frame_bytes: bytes, correlation_id: int,
                   expect_response: bool = True) -> asyncio.Future[bytes] | None:
        """Write one request; returns (with the future of its answer) once the broker has taken most of it in."""
        if self.closed or self.writer.is_closing():
            # The broker went away: writing on would only make asyncio warn at every frame. The client's connection
            # closes, and its reconnect tries the broker afresh.
            raise ConnectionError("upstream broker closed the connection")
        future: asyncio.Future[bytes] | None = None
        if expect_response:  # registered before the write: the answer may come while the request still drains
            future = asyncio.get_running_loop().create_future()
            self.pending[correlation_id] = future
        self.writer.write(wire.frame(frame_bytes))
        # While the broker reads slowly, the client waits here (its frame still counted in the frame budget) rather
        # than the gateway buffering whatever the client sends.
        await self.writer.drain()
        return future

    async def pump(self) -> None:
        try:
            while (frame_bytes := await wire.read_frame(self.reader)) is not None:
                correlation_id = wire.correlation_id(frame_bytes)
                future = self.pending.pop(correlation_id, None)
                if future is None:
                    # Some brokers (Tansu) answer acks=0 produce requests, whose clients expect no answer.
                    log.debug("dropping an answer nobody waits for (correlation id %d)", correlation_id)
                    continue
                if not future.done():  # its waiter may have been cancelled when the client left
                    future.set_result(frame_bytes)
        except (OSError, wire.FrameError) as exc:
            self.failed("upstream connection failed: %s", exc)
        finally:
            self.closed = True
            for future in self.pending.values():
                if not future.done():
                    future.set_exception(ConnectionError("upstream broker closed the connection"))
                    # Pipelined requests of a client that has gone are never awaited: marking the exception seen
                    # keeps asyncio from logging "Future exception was never retrieved"; a waiter still gets it.
                    future.exception()
            self.pending.clear()

    def close(self) -> None:
        self.writer.close()


class _UpstreamUnreachable(Exception):
    """Connecting to the upstream broker failed (its cause says why)."""


class Gateway:
    """An asyncio Kafka-protocol server in front of `upstream` (host, port), serving on `listener`, a socket already
    listening (bound before the broker starts, since the broker advertises its port); `host` is how it is named."""

    def __init__(self, upstream: tuple[str, int], store: SubscriptionStore, telemetry: TelemetryManager,
                 receiver: Receiver, listener: socket.socket, host: str = "127.0.0.1",
                 connections_max_idle_ms: int = DEFAULT_CONNECTIONS_MAX_IDLE_MS,
                 frame_budget_bytes: int = DEFAULT_FRAME_BUDGET_BYTES, metrics_topic: str | None = None) -> None:
        self.upstream = upstream
        # Refused to DeleteTopics: the embedded broker acknowledges writes to a deleted topic, and pushes would vanish.
        self.metrics_topic = metrics_topic
        self._listener = listener
        self.idle_timeout_s = connections_max_idle_ms / 1000
        self.frame_budget = wire.FrameBudget(frame_budget_bytes)
        self.store = store
        self.telemetry = telemetry
        self.receiver = receiver
        self.host = host
        self.port: int = listener.getsockname()[1]
        self.upstream_versions: dict[int, tuple[int, int]] = {}
        self._server: asyncio.base_events.Server | None = None
        self._connections: set[asyncio.Task[None]] = set()
        self._stopping = False
        self._ids = itertools.count(1)
        # A broker gone makes every client reconnect in a loop, each connection closed at once: each kind of
        # upstream trouble is logged once per 10 s, with a count.
        self.upstream_failed, self.upstream_unreachable, self.upstream_closed = (
            PacedLog(log, logging.WARNING, period_s=10.0) for _ in range(3))

    async def start(self) -> None:
        self.upstream_versions = await self._fetch_upstream_versions()
        self._server = await asyncio.start_server(self._serve, sock=self._listener)
        log.info("gateway listening on %s:%d, upstream broker %s:%d", self.host, self.port, *self.upstream)

    async def stop(self) -> None:
        self._stopping = True
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
        # A connection accepted just before the server closed may register while the others are being cancelled:
        # until none is left, or it would be suspended mid-request when the loop closes.
        while self._connections:
            tasks = list(self._connections)
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    async def _fetch_upstream_versions(self) -> dict[int, tuple[int, int]]:
        reader, writer = await asyncio.open_connection(*self.upstream)
        try:
            request = ApiVersionsRequest[3](client_software_name="kcm-sandbox", client_software_version="1")
            request.with_header(correlation_id=0, client_id="kcm-sandbox")
            writer.write(request.encode(header=True, framed=True))
            response = ApiVersionsResponse.decode(await wire.read_frame(reader), version=3, header=True)
            return {k.api_key: (k.min_version, k.max_version) for k in response.api_keys}
        finally:
            writer.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self._stopping:  # accepted as the gateway stops: served by no one
            writer.close()
            return
        task = asyncio.current_task()
        assert task is not None
        self._connections.add(task)
        address, port = writer.get_extra_info("peername")[:2]
        task.set_name(f"kcm-gateway {address}:{port}")  # which client a task serves, for debuggers and tests
        client = _Client(f"c{next(self._ids)}", address, port)
        connection = _Connection(self, client, reader, writer)
        try:
            await connection.run()
        except asyncio.CancelledError:
            pass
        except _UpstreamUnreachable as exc:
            self.upstream_unreachable("%s: cannot reach the upstream broker %s:%d (%s); closing the connection",
                                      client, *self.upstream, exc.__cause__)
        except OSError as exc:  # the client went away (e.g. a probe closing with an answer unread: a reset)
            log.debug("%s: connection ended: %s", client, exc)
        except Exception:  # one misbehaving client must never take the gateway down
            log.exception("%s: connection failed", client)
        finally:
            connection.close()
            self.telemetry.connection_closed(client.connection_id)
            self._connections.discard(task)


class _Connection:
    """One client connection: routes each request, and writes answers back in request order."""

    def __init__(self, gateway: Gateway, client: _Client, reader: asyncio.StreamReader,
                 writer: asyncio.StreamWriter) -> None:
        self.gateway = gateway
        self.client = client
        self.reader = reader
        self.writer = writer
        self.answers: asyncio.Queue[Awaitable[bytes | None] | None] = asyncio.Queue(maxsize=64)
        self.upstream: _Upstream | None = None
        self._pump: asyncio.Task[None] | None = None

    async def run(self) -> None:
        replies = asyncio.create_task(self._write_answers())
        stopping = False
        try:
            budget = self.gateway.frame_budget
            while (frame_bytes := await wire.read_frame(self.reader, self.gateway.idle_timeout_s, budget)) is not None:
                try:
                    started = time.perf_counter()
                    header = wire.parse_header(frame_bytes)
                    # Kafka's RequestHeader.parse reads a null client id as "": it matches `client_id=.*`.
                    self.client.client_id = "" if header.client_id is None else header.client_id
                    answer = await self._route(frame_bytes, header)
                    # Only kcm's own APIs are answered without waiting on anything: for the others, the time is
                    # the broker's, not the loop held.
                    held = time.perf_counter() - started if header.api_key in _LOCAL_VERSIONS else 0.0
                finally:
                    budget.release(len(frame_bytes))
                if answer is not None:
                    try:
                        await self.answers.put(answer)
                    except BaseException:
                        _discard(answer)
                        raise
                    if isinstance(answer, asyncio.Task):
                        # A push holds its metrics until delivered: like Kafka, which mutes a channel until its
                        # request is answered, read nothing more of this connection meanwhile (one push in memory).
                        await asyncio.wait([answer])
                # Frames already buffered are read without waiting: yield, so other clients get in between. A request
                # that held the loop long (a match pattern may take MATCH_TIMEOUT_S) makes its connection wait as
                # long, so one client's pipelined requests take at most about half of the loop from everyone else.
                await asyncio.sleep(held if held > _HOLD_S else 0)
        except wire.FrameError as exc:
            log.warning("%s: closing the connection: %s", self.client, exc)
        except asyncio.CancelledError:  # the gateway is stopping: answers still due are not waited for
            stopping = True
            replies.cancel()
            raise
        finally:
            try:
                if not stopping and not replies.done():  # answers already started are written in order, then it ends
                    await self.answers.put(None)
                await asyncio.gather(replies, return_exceptions=True)
            finally:  # also when the gateway stops during that wait
                replies.cancel()
                while not self.answers.empty():  # answers never written: started work is let go, not leaked
                    _discard(self.answers.get_nowait())

    def close(self) -> None:
        if self.upstream is not None:
            self.upstream.close()
        if self._pump is not None:
            self._pump.cancel()
        self.writer.close()

    async def _write_answers(self) -> None:
        broken = False
        while (answer := await self.answers.get()) is not None:
            if broken:  # keep taking answers, so the reader is never stuck on a full queue
                _discard(answer)
                continue
            try:
                payload = await answer
            except (ConnectionError, wire.FrameError) as exc:  # the upstream broker went away or misbehaved
                self.gateway.upstream_closed("%s: %s; closing the connection", self.client, exc)
            except Exception:  # one misbehaving client must never take the gateway down
                log.exception("%s: answering failed; closing the connection", self.client)
            else:
                try:
                    if payload is not None:
                        self.writer.write(wire.frame(payload))
                        await self.writer.drain()
                    continue
                except OSError as exc:  # the client went away with answers unread
                    log.debug("%s: connection ended: %s", self.client, exc)
            broken = True
            self.writer.close()

    async def _upstream(self) -> _Upstream:
        if self.upstream is None:
            try:
                reader, writer = await asyncio.open_connection(*self.gateway.upstream)
            except OSError as exc:
                raise _UpstreamUnreachable() from exc
            self.upstream = _Upstream(reader, writer, self.gateway.upstream_failed)
            self._pump = asyncio.create_task(self.upstream.pump())
        return self.upstream

    async def _route(self, frame_bytes: bytes, header: wire.RequestHeader) -> Awaitable[bytes | None] | None:
        """Start handling one request; returns what will become its answer (None: no answer is due)."""
        api_key, version = header.api_key, header.api_version
        if api_key in _LOCAL_VERSIONS:
            low, high = _LOCAL_VERSIONS[api_key]
            if not low <= version <= high:
                raise wire.FrameError(f"unsupported version {version} of API {api_key}")
            if api_key == GetTelemetrySubscriptionsRequest.API_KEY:
                return _done(self._get_subscriptions(frame_bytes, header))
            if api_key == PushTelemetryRequest.API_KEY:
                return self._push(frame_bytes, header)
            if api_key == ListConfigResourcesRequest.API_KEY:
                request = _decode(ListConfigResourcesRequest, frame_bytes, version)
                return _done(_encode(config_apis.list_resources(request, self.gateway.store), header))
        if api_key in _SPLIT_MAX_VERSIONS and version <= _SPLIT_MAX_VERSIONS[api_key]:
            return await self._split_config_request(frame_bytes, header)
        if api_key == ApiVersionsRequest.API_KEY and version > ApiVersionsRequest.max_version:
            # As a broker does: a v0 answer with UNSUPPORTED_VERSION and the versions it does support.
            response = ApiVersionsResponse[0](error_code=UNSUPPORTED_VERSION,
                                              api_keys=_api_version_entries(self.gateway.upstream_versions))
            return _done(_encode(response, header))
        if api_key == ApiVersionsRequest.API_KEY and not self._remember_software(frame_bytes, version):
            # KafkaApis: a v3+ request whose software name or version fails ApiVersionsRequest.isValid.
            return _done(_encode(ApiVersionsResponse[version](error_code=INVALID_REQUEST, api_keys=[]), header))
        if api_key == DeleteTopicsRequest.API_KEY and version <= DeleteTopicsRequest.max_version:
            request = _decode(DeleteTopicsRequest, frame_bytes, version)
            named = _topics_named(request, version)
            # v6+ may name a topic by its id alone: the metrics topic's id is asked of the broker for those.
            metrics_id = await self._metrics_topic_id(header) if None in named else None
            if self.gateway.metrics_topic in named or (
                    metrics_id is not None and any(_as_uuid(state.topic_id) == metrics_id for state in request.topics)):
                return await self._delete_topics_but_the_metrics_topic(request, header, metrics_id)
        upstream = await self._upstream()
        if api_key == ApiVersionsRequest.API_KEY:
            return self._api_versions(await upstream.send(frame_bytes, header.correlation_id), version)
        expect = api_key != 0 or wire.produce_expects_response(frame_bytes, header)
        return await upstream.send(frame_bytes, header.correlation_id, expect)

    def _remember_software(self, frame_bytes: bytes, version: int) -> bool:
        """Record the client software as SocketServer does; False when the request is invalid (nothing recorded)."""
        if version < 3:
            # v0-2 carry no software: Kafka registers ClientInformation("", ""), which reads as "unknown".
            self.client.software_name = self.client.software_version = UNKNOWN_SOFTWARE
            return True
        request = _decode(ApiVersionsRequest, frame_bytes, version)
        name, software_version = request.client_software_name, request.client_software_version
        if not (_SOFTWARE_PATTERN.fullmatch(name or "") and _SOFTWARE_PATTERN.fullmatch(software_version or "")):
            return False
        self.client.software_name, self.client.software_version = name, software_version
        return True

    async def _api_versions(self, answer: asyncio.Future[bytes] | None, version: int) -> bytes:
        assert answer is not None
        raw = await answer
        if version > ApiVersionsResponse.max_version:
            return raw
        response = ApiVersionsResponse.decode(raw, version=version, header=True)
        if response.error_code != 0:
            return raw
        response.api_keys = _api_version_entries(
            {k.api_key: (k.min_version, k.max_version) for k in response.api_keys})
        response.with_header(correlation_id=response.header.correlation_id)
        return bytes(response.encode(header=True))

    async def _split_config_request(self, frame_bytes: bytes, header: wire.RequestHeader) -> Awaitable[bytes]:
        request_class = config_apis.REQUEST_CLASSES[header.api_key]
        request = _decode(request_class, frame_bytes, header.api_version)
        api_name = request_class.__name__.removesuffix("Request")
        parts = config_apis.split(request, self.gateway.store)
        names = [r.resource_name for r, answer in zip(request.resources, parts.local) if answer is not None]
        if names:
            log.info("%s: %s on CLIENT_METRICS %s", self.client, api_name, ", ".join(names))
        if parts.upstream is None:
            return _done(_encode(config_apis.merge(request, parts, []), header))
        if header.api_key not in self.gateway.upstream_versions:
            answers = config_apis.unsupported(parts.upstream, f"the embedded broker does not support {api_name}")
            return _done(_encode(config_apis.merge(request, parts, answers), header))
        parts.upstream.with_header(correlation_id=header.correlation_id, client_id=header.client_id)
        upstream = await self._upstream()
        pending = await upstream.send(bytes(parts.upstream.encode(header=True)), header.correlation_id)
        assert pending is not None
        return self._merge(request, parts, pending, header)

    async def _merge(self, request: Any, parts: config_apis.Split, pending: Awaitable[bytes],
                     header: wire.RequestHeader) -> bytes:
        response_class = config_apis.RESPONSE_CLASSES[header.api_key]
        raw = await pending
        try:
            response = response_class.decode(raw, version=header.api_version, header=True)
        except Exception as exc:  # noqa: BLE001 - a malformed answer (Tansu's DescribeConfigs v0 of a changed topic)
            what = f"{response_class.__name__.removesuffix('Response')} v{header.api_version}"
            log.warning("%s: the embedded broker's %s answer could not be read (%s); its topic and broker resources "
                        "are answered UNKNOWN_SERVER_ERROR", self.client, what, type(exc).__name__)
            answers = config_apis.unsupported(parts.upstream, f"the embedded broker's {what} answer could not be "
                                              "read (another version of the request may do)", UNKNOWN_SERVER_ERROR)
            return _encode(config_apis.merge(request, parts, answers), header)
        merged = config_apis.merge(request, parts, config_apis.results(response), response.throttle_time_ms)
        return _encode(merged, header)

    async def _metrics_topic_id(self, header: wire.RequestHeader) -> uuid.UUID | None:
        """The metrics topic's id, from a Metadata request of the gateway's own (None: the broker gives no ids)."""
        supported = self.gateway.upstream_versions.get(MetadataRequest.API_KEY)
        if supported is None or supported[1] < 10:  # topic ids came with Metadata v10
            return None
        version = min(supported[1], MetadataRequest.max_version)
        request = MetadataRequest[version](
            topics=[MetadataRequest.MetadataRequestTopic(name=self.gateway.metrics_topic)],
            allow_auto_topic_creation=False, include_topic_authorized_operations=False)
        # The client's own correlation id: its DeleteTopics is sent only after this answer is in.
        request.with_header(correlation_id=header.correlation_id, client_id=header.client_id)
        upstream = await self._upstream()
        pending = await upstream.send(bytes(request.encode(header=True)), header.correlation_id)
        assert pending is not None
        response = MetadataResponse.decode(await pending, version=version, header=True)
        ids = [topic.topic_id for topic in response.topics
               if topic.name == self.gateway.metrics_topic and topic.error_code == 0]
        return _as_uuid(ids[0]) if ids else None

    async def _delete_topics_but_the_metrics_topic(self, request: Any, header: wire.RequestHeader,
                                                   metrics_id: uuid.UUID | None = None) -> Awaitable[bytes]:
        """Refuse the metrics topic of a DeleteTopics request (named, or given by its id `metrics_id`); the broker
        deletes the others, and answers are merged."""
        topic, version = self.gateway.metrics_topic, header.api_version
        log.warning("%s: refused to delete the metrics topic %s", self.client, topic)
        by_id = {"topic_id": metrics_id} if metrics_id is not None else {}  # clients deleting by id match by id
        refused = DeleteTopicsResponse.DeletableTopicResult(
            name=topic, error_code=_TOPIC_DELETION_DISABLED, **by_id,
            error_message=f"{topic} is the sandbox's metrics topic: it cannot be deleted while the sandbox runs")
        if version <= 5:
            request.topic_names = [name for name in request.topic_names if name != topic]
            others = request.topic_names
        else:
            request.topics = [state for state in request.topics if state.name != topic and (
                metrics_id is None or _as_uuid(state.topic_id) != metrics_id)]
            others = request.topics
        if not others:
            return _done(_encode(DeleteTopicsResponse[version](throttle_time_ms=0, responses=[refused]), header))
        request.with_header(correlation_id=header.correlation_id, client_id=header.client_id)
        upstream = await self._upstream()
        pending = await upstream.send(bytes(request.encode(header=True)), header.correlation_id)
        assert pending is not None
        return self._with_refusal(pending, refused, header)

    async def _with_refusal(self, pending: Awaitable[bytes], refused: Any, header: wire.RequestHeader) -> bytes:
        response = DeleteTopicsResponse.decode(await pending, version=header.api_version, header=True)
        response.responses.append(refused)  # clients match results by name
        return _encode(response, header)

    def _get_subscriptions(self, frame_bytes: bytes, header: wire.RequestHeader) -> bytes:
        request = _decode(GetTelemetrySubscriptionsRequest, frame_bytes, header.api_version)
        result = self.gateway.telemetry.get_subscriptions(
            request.client_instance_id, self.client.identity(), connection_id=self.client.connection_id)
        if result.error_code == 0:
            self.client.instance_id = result.client_instance_id
            log.info("%s (%s %s): subscription %d, every %d ms, metrics %s", self.client, self.client.software_name,
                     self.client.software_version, result.subscription_id, result.push_interval_ms,
                     ",".join(result.requested_metrics) or "(none)")
        else:
            log.info("%s: GetTelemetrySubscriptions refused with error %d: %s", self.client, result.error_code,
                     result.error_message)
        response = GetTelemetrySubscriptionsResponse[header.api_version](
            throttle_time_ms=result.throttle_time_ms, error_code=result.error_code,
            client_instance_id=result.client_instance_id, subscription_id=result.subscription_id,
            accepted_compression_types=result.accepted_compression_types, push_interval_ms=result.push_interval_ms,
            telemetry_max_bytes=result.telemetry_max_bytes, delta_temporality=result.delta_temporality,
            requested_metrics=result.requested_metrics)
        return _encode(response, header)

    def _push(self, frame_bytes: bytes, header: wire.RequestHeader) -> asyncio.Task[bytes]:
        # The ladder runs now, in request order; decompression and the write to the metrics topic start at once, and
        # the connection is read no further until they end.
        request = _decode(PushTelemetryRequest, frame_bytes, header.api_version)
        if request.client_instance_id is not None:
            self.client.instance_id = request.client_instance_id
        result = self.gateway.telemetry.admit(
            request.client_instance_id, request.subscription_id, request.terminating, request.compression_type,
            request.metrics, self.client.identity(), connection_id=self.client.connection_id)
        codec = contract.COMPRESSION_IDS.get(request.compression_type, str(request.compression_type))
        return asyncio.create_task(self._deliver(request.client_instance_id, result, header, codec))

    async def _deliver(self, instance_id: uuid.UUID, result: PushResult, header: wire.RequestHeader,
                       codec: str) -> bytes:
        telemetry = self.gateway.telemetry
        if result.compressed is not None:
            # Decompressing and parsing take time proportional to the push: never on the event loop.
            result = telemetry.settle(instance_id, await asyncio.to_thread(telemetry.unpack, result))
        error_code = result.error_code
        if error_code == 0 and result.payload is not None:
            try:
                await asyncio.get_running_loop().run_in_executor(
                    None, self.gateway.receiver, instance_id, self.client.identity(), result)
            except Exception as exc:  # Kafka answers INVALID_RECORD when its receiver plugin fails
                log.error("%s: could not write the push to the metrics topic: %s", self.client, exc)
                error_code = INVALID_RECORD
        if error_code == 0:
            log.info("%s: push accepted (%d bytes, compression %s%s)", self.client, len(result.payload or b""),
                     codec, ", terminating" if result.terminating else "")
        else:
            log.info("%s: push refused with error %d: %s", self.client, error_code, result.error_message)
        response = PushTelemetryResponse[header.api_version](throttle_time_ms=result.throttle_time_ms,
                                                            error_code=error_code)
        return _encode(response, header)


def _decode(request_class: Any, frame_bytes: bytes, version: int) -> Any:
    try:
        return request_class.decode(frame_bytes, version=version, header=True)
    except Exception as exc:  # a request we cannot parse: a broker closes the connection (InvalidRequestException)
        raise wire.FrameError(f"cannot parse {request_class.__name__} v{version}: {exc}") from exc


def _topics_named(request: Any, version: int) -> list[str | None]:
    """The topics a DeleteTopics request names (v6+ may give a topic id instead: None)."""
    return list(request.topic_names) if version <= 5 else [state.name for state in request.topics]


def _as_uuid(value: Any) -> uuid.UUID | None:
    """A topic id as kafka-python's schemas give it (a UUID or its text), None for none or the zero id."""
    if value is None:
        return None
    value = value if isinstance(value, uuid.UUID) else uuid.UUID(str(value))
    return value if value.int else None


def _encode(response: Any, header: wire.RequestHeader) -> bytes:
    response.with_header(correlation_id=header.correlation_id)
    return bytes(response.encode(header=True))


def _api_version_entries(upstream: dict[int, tuple[int, int]]) -> list[Any]:
    """What the gateway advertises: upstream's APIs, ours added, config APIs capped at what we can parse."""
    versions = {**upstream, **_LOCAL_VERSIONS}
    for api_key, high in _SPLIT_MAX_VERSIONS.items():
        if api_key in versions:
            versions[api_key] = (versions[api_key][0], min(versions[api_key][1], high))
    entry = ApiVersionsResponse.ApiVersion
    return [entry(api_key=k, min_version=low, max_version=high) for k, (low, high) in sorted(versions.items())]


async def _done(payload: bytes) -> bytes:
    return payload


def _discard(answer: Awaitable[bytes | None] | None) -> None:
    """Let go of an answer that will never be written: a coroutine is closed, a future cancelled."""
    if asyncio.iscoroutine(answer):
        answer.close()
    elif isinstance(answer, asyncio.Future):
        if answer.done() and not answer.cancelled():
            answer.exception()  # seen, so asyncio does not log "exception was never retrieved"
        answer.cancel()

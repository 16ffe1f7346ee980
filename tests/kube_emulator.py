"""A Kubernetes API for tests: kmock 0.8's emulator made truthful enough for kopf, served from a thread.

kmock as shipped gives objects no uid/resourceVersion/generation/creationTimestamp, answers POST with 200,
lets a main-resource patch rewrite status (and the reverse), fails `generateName` the second time and
re-scans every past request on each new one. `KubeEmulator` fixes exactly those; docs/operator.md lists what
it still does not do (schema validation, defaulting, selectors, watch resume).
"""

from __future__ import annotations

import asyncio
import copy
import datetime
import logging
import secrets
import threading
import uuid
from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from typing import Any

import aiohttp.web
import attrs
import jsonpatch
import jsonpointer
import kmock
import yaml
from kmock._internal import dicts, dsl, enums

_WRITES = (enums.action.CREATE, enums.action.UPDATE, enums.action.DELETE)
_KEPT_REQUESTS = 20  # enough for a test to look at the last few; more makes every request slower
logging.getLogger("aiohttp.access").setLevel(logging.WARNING)  # one line per request drowns test output


@attrs.define(kw_only=True)
class KubeEmulator(kmock.KubernetesEmulator):
    """kmock's KubernetesEmulator with server-set metadata, 201 on create, a separate status and bounded history."""

    _version: int = attrs.field(default=0, init=False)
    _writes: asyncio.Lock = attrs.field(factory=asyncio.Lock, init=False)  # read-compute-write without interleaving
    # (plural, namespace, name) of objects whose next JSON patch loses a race: another client makes the same change
    # first, and this one is answered 422 for its resourceVersion test (as two kopf replicas adding one finalizer).
    racing_json_patches: set[tuple[str, str | None, str]] = attrs.field(factory=set, init=False)
    # (plural, namespace, name, subresource or None) of merge patches refused with 403 while listed (an admission
    # webhook refusing them for a while); JSON patches (kopf's finalizers) pass.
    forbidden_patches: set[tuple[str, str | None, str, str | None]] = attrs.field(factory=set, init=False)
    # (plural, namespace, name, subresource or None) → how many more of its merge patches to answer 503 (an API
    # server failing for a moment); also counted in `refused_patches`.
    failing_patches: dict[tuple[str, str | None, str, str | None], int] = attrs.field(factory=dict, init=False)
    refused_patches: int = attrs.field(default=0, init=False)   # how many it refused

    async def _handle(self, request: kmock.Request) -> aiohttp.web.StreamResponse:
        try:
            if request.resource is None or request.action not in _WRITES:
                return await super()._handle(request)
            async with self._writes:
                return await self._write(request)
        except kmock.KubernetesError as exc:  # answered here so kmock does not re-raise it when the server stops
            return await self._render_error(exc)
        finally:
            self._trim(request)

    async def _write(self, request: kmock.Request) -> aiohttp.web.StreamResponse:
        if request.action == enums.action.CREATE:
            request = self._replace(request, self._created(request))
        elif request.name and request.action == enums.action.UPDATE:
            race = (request.resource.plural, request.namespace, request.name)
            merge, key = not isinstance(request.data, list), (*race, request.subresource or None)
            if merge and key in self.forbidden_patches:
                self.refused_patches += 1
                where = request.subresource or "main"
                raise kmock.KubernetesError(403, "Forbidden", f"cannot patch {request.resource.plural} "
                                            f"{request.name!r} ({where}): refused for this test")
            if merge and self.failing_patches.get(key, 0) > 0:
                self.failing_patches[key] -= 1
                self.refused_patches += 1
                raise kmock.KubernetesError(503, "ServiceUnavailable", "failing for this test")
            if isinstance(request.data, list) and race in self.racing_json_patches:
                self.racing_json_patches.discard(race)
                await super()._handle(self._replace(request, self._as_merge_patch(request)))  # the other client's
                raise kmock.KubernetesError(422, "Invalid", "the JSON patch does not apply: test failed at "
                                            "/metadata/resourceVersion")
            request = self._replace(request, self._as_merge_patch(request))
        elif request.name and request.action == enums.action.DELETE:
            self._bump_before_delete(request)
        response = await super()._handle(request)
        if request.action == enums.action.CREATE and response.status == 200:
            response.set_status(201)
        return response

    async def _serve_list(self, request: kmock.Request) -> kmock.Payload:
        listing = await super()._serve_list(request)
        listing["metadata"]["resourceVersion"] = str(self._version)
        return listing

    async def _serve_watch(self, request: kmock.Request) -> AsyncIterator[kmock.Payload]:
        # kmock replays every object and then listens, losing what changed in between and since the client's
        # listing; here the bus is marked first and a watch from `resourceVersion` N sends only what is newer.
        yield b""
        since = request.params.get("resourceVersion", "")
        since_version = int(since) if since.isdigit() else 0
        async with self._lock:
            bus = self._buses[request.resource]
            marker = await bus.mark()
            snapshot = [obj.raw for (resource, namespace, _), obj in self.objects.items()
                        if resource == request.resource and not obj.deleted
                        and request.namespace in (None, namespace)]
        sent: dict[str, int] = {}
        try:
            for raw in snapshot:
                version = int(raw["metadata"]["resourceVersion"])
                if version > since_version:
                    sent[raw["metadata"]["uid"]] = version
                    yield {"type": "MODIFIED" if since_version else "ADDED", "object": raw}
            async for event in bus.stream(since=marker):
                meta = event["object"].get("metadata", {})
                if request.namespace not in (None, meta.get("namespace")):
                    continue
                if int(meta.get("resourceVersion", 0)) <= max(since_version, sent.get(meta.get("uid"), 0)) \
                        and event["type"] != "DELETED":
                    continue
                yield event
        finally:
            await bus.unmark(marker)

    def _next_version(self) -> str:
        self._version += 1
        return str(self._version)

    def _replace(self, request: kmock.Request, data: dict[str, Any]) -> kmock.Request:
        # Reactions find their requests by identity in the recorded history, so record the rewritten one.
        rewritten = attrs.evolve(request, data=data)
        self._requests[:] = [rewritten if seen is request else seen for seen in self._requests]
        return rewritten

    def _created(self, request: kmock.Request) -> dict[str, Any]:
        obj = copy.deepcopy(request.data or {})
        meta = obj.setdefault("metadata", {})
        if not meta.get("name") and meta.get("generateName"):
            meta["name"] = meta["generateName"] + secrets.token_hex(3)[:5]
        if request.namespace:
            meta["namespace"] = request.namespace
        meta.update(uid=str(uuid.uuid4()), resourceVersion=self._next_version(), generation=1,
                    creationTimestamp=_now())
        if self._has_status(request):
            obj.pop("status", None)
        return obj

    def _as_merge_patch(self, request: kmock.Request) -> dict[str, Any]:
        current = self._current(request)
        try:
            if request.method == enums.method.PUT:
                wanted = copy.deepcopy(request.data)
                sent_version = (wanted.get("metadata") or {}).get("resourceVersion")
                if sent_version and sent_version != current["metadata"]["resourceVersion"]:
                    raise kmock.KubernetesError(409, "Conflict", "the object has been modified")
            else:
                wanted = copy.deepcopy(dict(dicts.patch_dict(current, request.data)))
        except (jsonpatch.JsonPatchException, jsonpointer.JsonPointerException) as exc:
            raise kmock.KubernetesError(422, "Invalid", f"the JSON patch does not apply: {exc}") from None
        if request.subresource == "status":
            wanted = {**copy.deepcopy(current), "status": wanted.get("status")}
        elif self._has_status(request):
            wanted["status"] = copy.deepcopy(current.get("status"))
        meta = wanted.setdefault("metadata", {})
        for key in ("uid", "creationTimestamp", "name", "namespace", "generation", "resourceVersion"):
            meta[key] = current["metadata"].get(key)
        if wanted.get("spec") != current.get("spec"):
            meta["generation"] = current["metadata"]["generation"] + 1
        if wanted != current:
            meta["resourceVersion"] = self._next_version()
        return _merge_diff(current, wanted)

    def _bump_before_delete(self, request: kmock.Request) -> None:
        # Marking for deletion (finalizers present) is a change kopf's next JSON patch tests against.
        current = self._current(request)
        if current["metadata"].get("finalizers") and not current["metadata"].get("deletionTimestamp"):
            self.objects[request.resource, request.namespace, request.name].patch(
                {"metadata": {"resourceVersion": self._next_version()}})

    def _current(self, request: kmock.Request) -> dict[str, Any]:
        key = (request.resource, request.namespace, request.name)
        if key not in self.objects or self.objects[key].deleted:
            raise kmock.KubernetesObjectNotFoundError()
        return copy.deepcopy(self.objects[key].raw)

    def _has_status(self, request: kmock.Request) -> bool:
        return any(resource == request.resource and "status" in self.resources[resource].subresources
                   for resource in self._resources)

    def _trim(self, request: kmock.Request) -> None:
        del self._requests[:-_KEPT_REQUESTS]
        for reaction in self._walk(dsl.Reaction):
            del reaction._requests[:-_KEPT_REQUESTS]
        key = (request.resource, request.namespace, request.name)
        if request.resource is not None and request.name and key in self.objects:
            del self.objects[key].history[:-2]  # the last state, and the deletion mark after it


def _merge_diff(old: Mapping[str, Any], new: Mapping[str, Any]) -> dict[str, Any]:
    """The merge patch (None deletes a key) that turns `old` into `new`."""
    patch: dict[str, Any] = {key: None for key in old if key not in new}
    for key, value in new.items():
        if isinstance(value, dict) and isinstance(old.get(key), dict):
            nested = _merge_diff(old[key], value)
            if nested:
                patch[key] = nested
        elif key not in old or old[key] != value:
            patch[key] = value
    return patch


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class KubeServer:
    """Runs a KubeEmulator on a loopback port in its own thread; `kubeconfig` points clients at it."""

    def __init__(self, directory: Path, crds: list[Path]) -> None:
        self.emulator = KubeEmulator()
        self.kubeconfig = directory / "kubeconfig"
        self._crds = crds
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="kube-emulator", daemon=True)
        self._stop: asyncio.Event | None = None
        self._done: asyncio.Future[None] | None = None

    def start(self, timeout: float = 10.0) -> None:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._started(), self._loop).result(timeout)

    def stop(self, timeout: float = 10.0) -> None:
        if self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
            asyncio.run_coroutine_threadsafe(asyncio.wait_for(asyncio.shield(self._done), timeout),
                                             self._loop).result(timeout + 1)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout)

    def objects(self, plural: str, namespace: str | None = None) -> dict[str, dict[str, Any]]:
        """The live objects of a resource (by plural, e.g. "events"), by name; safe to call from any thread."""
        async def collect() -> dict[str, dict[str, Any]]:
            return {name: copy.deepcopy(obj.raw) for (resource, ns, name), obj in self.emulator.objects.items()
                    if resource.plural == plural and (namespace is None or ns == namespace) and not obj.deleted}
        return asyncio.run_coroutine_threadsafe(collect(), self._loop).result(10)

    async def _started(self) -> None:
        ready = asyncio.Event()
        self._stop = asyncio.Event()
        self._done = asyncio.ensure_future(self._serve(ready))
        await ready.wait()

    async def _serve(self, ready: asyncio.Event) -> None:
        async with self.emulator, kmock.Server(self.emulator) as server:
            self._declare_resources()
            self._write_kubeconfig(f"http://{server.host}:{server.port}")
            ready.set()
            await self._stop.wait()

    def _declare_resources(self) -> None:
        resources = self.emulator.resources
        for path in self._crds:
            crd = yaml.safe_load(path.read_text())
            names = crd["spec"]["names"]
            for version in crd["spec"]["versions"]:
                resources[f"{crd['spec']['group']}/{version['name']}/{names['plural']}"] = kmock.ResourceInfo(
                    kind=names["kind"], singular=names["singular"], namespaced=crd["spec"]["scope"] == "Namespaced",
                    shortnames=names.get("shortNames", ()), categories=names.get("categories", ()),
                    subresources=version.get("subresources", {}).keys(),
                    verbs=("get", "list", "watch", "create", "update", "patch", "delete"))
        for plural, kind in (("events", "Event"), ("secrets", "Secret"), ("namespaces", "Namespace")):
            resources[f"v1/{plural}"] = kmock.ResourceInfo(
                kind=kind, namespaced=plural != "namespaces",
                verbs=("get", "list", "watch", "create", "update", "patch", "delete"))
        # kopf's peering objects: no status subresource, as in kopf's own CRDs (keep-alives merge-patch status).
        for plural, kind, namespaced in (("kopfpeerings", "KopfPeering", True),
                                         ("clusterkopfpeerings", "ClusterKopfPeering", False)):
            resources[f"kopf.dev/v1/{plural}"] = kmock.ResourceInfo(
                kind=kind, namespaced=namespaced, verbs=("get", "list", "watch", "create", "patch", "delete"))

    def _write_kubeconfig(self, url: str) -> None:
        self.kubeconfig.write_text(yaml.safe_dump({
            "apiVersion": "v1", "kind": "Config", "current-context": "emulator",
            "clusters": [{"name": "emulator", "cluster": {"server": url}}],
            "users": [{"name": "tester", "user": {"token": "emulator"}}],
            "contexts": [{"name": "emulator", "context": {"cluster": "emulator", "user": "tester"}}],
        }))

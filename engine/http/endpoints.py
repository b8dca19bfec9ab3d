"""A pool of endpoints on the wire: each key's requests go to its endpoint, as its API wants them.

`PoolTransport` holds one `HttpTransport` per endpoint (`[[endpoints]]`, settings.EndpointSpec):
its URL, how its key travels, its API's rules and delays, its own connections. A key's
attempt goes through its endpoint's transport, the request rewritten for it by
`EndpointPaths`:

- the body's `model` becomes the endpoint's name for it (`models = { "gpt-4o-mini" =
  "mini" }`: Azure's deployment, a compatible provider's own model id);
- on Azure OpenAI (`target.api_style = "azure"`), OpenAI's `/v1/chat/completions` goes as
  `/openai/v1/chat/completions`, or with `target.api_version`, as
  `/openai/deployments/{deployment}/chat/completions?api-version=...`.

The answer is the upstream's as it came: a gateway's client reads what the endpoint said.
The request itself is never changed (a retry may go to another endpoint): each attempt
sends a rewritten copy of its shape.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from ratedeck.core.vocab import ApiStyle
from ratedeck.engine.request import Shape
from ratedeck.engine.settings import EndpointSpec

from .transport import HttpTransport, TransportBase, http_transport

if TYPE_CHECKING:
    from ratedeck.engine.http.outcome import Outcome
    from ratedeck.engine.ports import ProbeGet
    from ratedeck.engine.request import Request
    from ratedeck.engine.settings import EngineSettings, KeySpec

#: The prefix of OpenAI's paths, which Azure OpenAI serves under /openai.
_V1 = "/v1/"


class EndpointPaths:
    """How one endpoint wants a request: its path and its body's model (see the module)."""

    __slots__ = ("style", "version", "names")

    def __init__(self, endpoint: EndpointSpec) -> None:
        target = endpoint.target
        self.style = target.api_style
        self.version = target.api_version
        models = endpoint.models or {}
        # the model clients name -> the endpoint's name for it, where the two differ
        self.names = {m: r.deployment for m, r in models.items() if r.deployment and r.deployment != m}

    @property
    def needed(self) -> bool:
        """Whether any request needs rewriting for this endpoint."""
        return bool(self.names) or self.style is ApiStyle.AZURE

    def shape_for(self, shape: Shape) -> Shape:
        """`shape` as this endpoint wants it (the same object when nothing changes)."""
        body = shape.body
        model = body.get("model") if isinstance(body, dict) else None
        # a model that is not a name (a client's mistake) goes as written, for the upstream to refuse
        name = self.names.get(model, model) if isinstance(model, str) else model
        path = shape.path
        if self.style is ApiStyle.AZURE and path is not None:
            path = self._azure_path(path, name if isinstance(name, str) else None)
        changes: dict[str, Any] = {}
        if path != shape.path:
            changes["path"] = path
        if name != model and isinstance(body, dict) and not (self.version and path != shape.path):
            # the v1 path (and any plain API) names the deployment in the body; the
            # deployments path names it in the URL and leaves the body as the client wrote it
            new_body = {**body, "model": name}
            changes["body"], changes["payload"] = new_body, Shape.encode(new_body)
        return replace(shape, **changes) if changes else shape

    def _azure_path(self, path: str, deployment: str | None) -> str:
        """OpenAI's /v1/... as Azure's: /openai/v1/..., or the deployments path with an api-version."""
        raw, sep, query = path.partition("?")
        if not raw.startswith(_V1):
            return path  # already Azure's (/openai/...), or not OpenAI's API: as given
        rest = raw[len(_V1) - 1 :]  # "/chat/completions"
        if self.version and deployment:
            version = f"api-version={quote(self.version, safe='')}"
            query = f"{query}&{version}" if query else version
            return f"/openai/deployments/{quote(deployment, safe='')}{rest}?{query}"
        return f"/openai/v1{rest}{sep}{query}"


class PoolTransport(TransportBase):
    """Every endpoint's transport, each key's attempts through its own endpoint's (see the module)."""

    def __init__(self, by_endpoint: Mapping[str, tuple[HttpTransport, EndpointPaths]]) -> None:
        self.by_endpoint = dict(by_endpoint)

    async def send(self, key: KeySpec, req: Request, nonce: int | None) -> Outcome:
        endpoint = key.endpoint
        assert endpoint is not None, "a pool's keys each belong to an endpoint"
        transport, paths = self.by_endpoint[endpoint.name]
        return await _send_as(transport, paths, key, req, nonce)

    async def close(self) -> None:
        for transport, _ in self.by_endpoint.values():
            await transport.close()

    def stats(self) -> dict[str, Any]:
        """The endpoints' counts summed, and each endpoint's own under "endpoints"."""
        per = {name: t.stats() for name, (t, _) in self.by_endpoint.items()}
        total: dict[str, Any] = {}
        for stats in per.values():
            for name, value in stats.items():
                if isinstance(value, dict):
                    into = total.setdefault(name, {})
                    for k, v in value.items():
                        into[k] = into.get(k, 0) + v
                elif isinstance(value, int | float):
                    total[name] = total.get(name, 0) + value
        # the target is dead only when every endpoint is: the fewest failures in a row
        total["consecutive_no_answer"] = min(
            (s.get("consecutive_no_answer", 0) for s in per.values()), default=0
        )
        total["endpoints"] = per
        return total

    def prober(self) -> ProbeGet | None:
        return None


async def _send_as(
    transport: HttpTransport, paths: EndpointPaths, key: KeySpec, req: Request, nonce: int | None
) -> Outcome:
    """One attempt through `transport`, its shape as `paths` wants it for this attempt only."""
    shape = req.shape
    if shape is None or not paths.needed:
        return await transport.send(key, req, nonce)
    adapted = paths.shape_for(shape)
    if adapted is shape:
        return await transport.send(key, req, nonce)
    req.shape = adapted  # this attempt's shape, put back at once: a retry may go elsewhere
    try:
        return await transport.send(key, req, nonce)
    finally:
        req.shape = shape


class StyledTransport(TransportBase):
    """One target whose API wants paths of its own (`--preset azure-openai --target URL`): every
    attempt through the target's transport, rewritten as a pool's endpoint's would be."""

    def __init__(self, transport: HttpTransport, paths: EndpointPaths) -> None:
        self.transport, self.paths = transport, paths

    async def send(self, key: KeySpec, req: Request, nonce: int | None) -> Outcome:
        return await _send_as(self.transport, self.paths, key, req, nonce)

    async def close(self) -> None:
        await self.transport.close()

    def stats(self) -> dict[str, Any]:
        return self.transport.stats()

    def prober(self) -> ProbeGet | None:
        return self.transport.prober()


def pool_transport(cfg: EngineSettings) -> PoolTransport:
    """One transport per endpoint of `cfg`: enough connections for its keys' in-flight
    requests, its keys' secrets masked, the config's path rules."""
    by_endpoint: dict[str, tuple[HttpTransport, EndpointPaths]] = {}
    for endpoint in cfg.endpoints:
        keys = [k for k in cfg.keys if k.endpoint is not None and k.endpoint.name == endpoint.name]
        secrets = [k.secret for k in keys] + [k.api_secret for k in keys if k.api_secret]
        max_conn = max(1, len(keys) * cfg.in_flight_ceiling)
        url = endpoint.target.url or ""
        transport = HttpTransport(endpoint.target, url, max_conn, secrets=secrets, paths=cfg.paths)
        by_endpoint[endpoint.name] = (transport, EndpointPaths(endpoint))
    return PoolTransport(by_endpoint)


def run_transport(cfg: EngineSettings, url: str) -> HttpTransport | PoolTransport | StyledTransport:
    """The transport for a run: one per endpoint with [[endpoints]] (`pool_transport`), else
    the one target's at `url` (`transport.http_transport`)."""
    if cfg.endpoints:
        return pool_transport(cfg)
    transport = http_transport(cfg, url)
    if cfg.target.api_style is ApiStyle.PLAIN:
        return transport
    one = EndpointSpec(name="target", preset="", target=cfg.target)
    return StyledTransport(transport, EndpointPaths(one))

"""`EndpointPaths.shape_for` (engine/http/endpoints.py): how one endpoint of a pool wants a
request, as a pure function of the request's shape.

Azure OpenAI: OpenAI's /v1/... goes as /openai/v1/... with the deployment as the body's
model, or (with api_version) as /openai/deployments/{deployment}/...?api-version=... with
the body as the client wrote it. A plain API: only the body's model, where the endpoint's
name for it differs. Nothing to change: the same object. The given shape is never changed.
"""

from __future__ import annotations

import copy
import json

from ratedeck.core.vocab import ApiStyle
from ratedeck.engine.http.endpoints import EndpointPaths
from ratedeck.engine.request import Shape
from ratedeck.engine.settings import EndpointSpec, ModelRoute, TargetConfig

CHAT = "/v1/chat/completions"


def paths(style=ApiStyle.PLAIN, version=None, models=None, preset="openai") -> EndpointPaths:
    target = TargetConfig(url="https://example.test", api_style=style, api_version=version)
    routes = None if models is None else {m: ModelRoute(deployment=d) for m, d in models.items()}
    return EndpointPaths(EndpointSpec(name="e", preset=preset, target=target, models=routes))


def azure(version=None, models=None) -> EndpointPaths:
    return paths(ApiStyle.AZURE, version, models, preset="azure-openai")


def chat(model="gpt-4o-mini", path=CHAT, **extra) -> Shape:
    body = {"model": model, "messages": [{"role": "user", "content": "hi"}], **extra}
    return Shape(method="POST", path=path, body=body, payload=Shape.encode(body))


def sent(shape: Shape) -> dict:
    """The body as it goes on the wire (the payload), which must be the shape's body."""
    assert shape.payload is not None
    wire = json.loads(shape.payload)
    assert wire == shape.body
    return wire


def test_azure_v1_path_names_the_deployment_in_the_body():
    given = chat(max_tokens=50)
    before = copy.deepcopy(given.body)
    out = azure(models={"gpt-4o-mini": "mini"}).shape_for(given)
    assert out.path == "/openai/v1/chat/completions"
    assert sent(out) == {**before, "model": "mini"}
    assert out.method == "POST" and out is not given
    # the request's own shape is left as it was (a retry may go to another endpoint)
    assert given.path == CHAT and given.body == before and json.loads(given.payload) == before


def test_azure_v1_path_without_an_alias_keeps_the_model_and_the_body():
    given = chat()
    out = azure().shape_for(given)  # no models table: the model clients name is the deployment's name
    assert out.path == "/openai/v1/chat/completions"
    assert out.body is given.body and out.payload is given.payload


def test_azure_deployments_path_with_an_api_version_leaves_the_body_as_written():
    given = chat()
    out = azure("2024-10-21", {"gpt-4o-mini": "mini"}).shape_for(given)
    assert out.path == "/openai/deployments/mini/chat/completions?api-version=2024-10-21"
    assert out.body is given.body and out.payload is given.payload  # the URL names the deployment


def test_azure_deployments_path_keeps_an_existing_query_string():
    given = chat(path=CHAT + "?stream=false&x=1")
    out = azure("2024-10-21", {"gpt-4o-mini": "mini"}).shape_for(given)
    assert out.path == "/openai/deployments/mini/chat/completions?stream=false&x=1&api-version=2024-10-21"


def test_azure_deployments_path_without_an_alias_uses_the_model_name():
    out = azure("2024-10-21").shape_for(chat("gpt-4o"))
    assert out.path == "/openai/deployments/gpt-4o/chat/completions?api-version=2024-10-21"


def test_azure_v1_path_keeps_an_existing_query_string():
    out = azure(models={"gpt-4o-mini": "mini"}).shape_for(chat(path=CHAT + "?a=1"))
    assert out.path == "/openai/v1/chat/completions?a=1" and out.body["model"] == "mini"


def test_azure_with_an_api_version_and_no_model_in_the_body_takes_the_v1_path():
    """No model, no deployment to put in the URL: the v1 path, which needs none there."""
    given = Shape(method="GET", path="/v1/models")
    out = azure("2024-10-21").shape_for(given)
    assert out.path == "/openai/v1/models" and out.body is None


def test_a_plain_api_renames_the_model_and_keeps_the_path():
    given = chat()
    out = paths(models={"gpt-4o-mini": "meta-llama/Llama-3.3-70B-Instruct-Turbo"}).shape_for(given)
    assert out.path == CHAT
    assert sent(out)["model"] == "meta-llama/Llama-3.3-70B-Instruct-Turbo"
    assert given.body["model"] == "gpt-4o-mini"


def test_nothing_to_change_is_the_same_object():
    given = chat()
    assert paths().shape_for(given) is given  # a plain API, no models
    assert paths(models={"gpt-4o-mini": "gpt-4o-mini"}).shape_for(given) is given  # the same name
    assert paths(models={"other": "x"}).shape_for(given) is given  # another model's alias
    assert not paths(models={"gpt-4o-mini": "gpt-4o-mini"}).needed
    assert paths(models={"gpt-4o-mini": "mini"}).needed and azure().needed
    # Azure's own paths, as a client already wrote them
    native = chat(path="/openai/v1/chat/completions")
    assert azure().shape_for(native) is native
    deployments = chat(path="/openai/deployments/mini/chat/completions?api-version=2024-10-21")
    assert azure("2024-10-21").shape_for(deployments) is deployments


def test_a_path_not_under_v1_is_left_alone():
    for path in (
        "/health",
        "/v1",
        "/v10/chat/completions",
        "/openai/v1/embeddings",
        "/x/v1/chat/completions",
    ):
        given = chat(path=path)
        out = azure("2024-10-21").shape_for(given)
        assert out is given, path
    # the body's model is still the endpoint's name for it (the v1 convention)
    out = azure(models={"gpt-4o-mini": "mini"}).shape_for(chat(path="/openai/v1/chat/completions"))
    assert out.path == "/openai/v1/chat/completions" and out.body["model"] == "mini"


def test_a_shape_without_a_path_or_a_json_body_is_left_alone():
    no_path = Shape(method="POST", body={"model": "gpt-4o-mini"}, payload=b'{"model":"gpt-4o-mini"}')
    out = azure().shape_for(no_path)
    assert out.path is None and out.body == {"model": "gpt-4o-mini"}
    form = Shape(method="POST", path="/x", body="form")
    assert paths(models={"gpt-4o-mini": "mini"}).shape_for(form) is form
    array = Shape(method="POST", path="/x", body=[{"model": "gpt-4o-mini"}], payload=b"[]")
    assert paths(models={"gpt-4o-mini": "mini"}).shape_for(array) is array
    odd = chat(model=7)  # not a model name: nothing to rename
    assert paths(models={"gpt-4o-mini": "mini"}).shape_for(odd) is odd
    # on Azure too: the body as written (not "model": null), no deployment in the URL
    out = azure("2024-10-21", {"gpt-4o-mini": "mini"}).shape_for(odd)
    assert out.path == "/openai/v1/chat/completions" and out.body is odd.body


def test_unicode_and_special_characters_in_a_deployment_are_quoted():
    out = azure("2024-10-21", {"gpt-4o-mini": "mini/β v2?#&"}).shape_for(chat())
    assert out.path == (
        "/openai/deployments/mini%2F%CE%B2%20v2%3F%23%26/chat/completions?api-version=2024-10-21"
    )
    odd_version = azure("2024-10-21 preview&x=1", {"gpt-4o-mini": "mini"}).shape_for(chat())
    assert odd_version.path.endswith("?api-version=2024-10-21%20preview%26x%3D1")
    # in the body (the v1 path) a name goes as it is, in JSON, not as UTF-8 escapes
    v1 = azure(models={"gpt-4o-mini": "déploiement-β"}).shape_for(chat())
    assert "déploiement-β".encode() in v1.payload and sent(v1)["model"] == "déploiement-β"

"""The client's route table is the server's: every operation of the OpenAPI
schema has its route, with the same method, path and Idempotency-Key."""
import pytest
from drf_spectacular.generators import SchemaGenerator
from switchboard_client import ROUTES

pytestmark = pytest.mark.django_db


def schema_operations() -> dict[str, tuple[str, str, bool]]:
    schema = SchemaGenerator().get_schema(request=None, public=True)
    found = {}
    for path, operations in schema["paths"].items():
        if not path.startswith("/v0/") or path == "/v0/schema/":
            continue
        for method, operation in operations.items():
            headers = {p["name"] for p in operation.get("parameters", []) if p["in"] == "header"}
            found[operation["operationId"]] = (method.upper(), path.removeprefix("/v0/"),
                                               "Idempotency-Key" in headers)
    return found


def test_every_route_of_the_schema_is_in_the_table_and_nothing_else():
    # given
    served = schema_operations()
    # when
    table = {name: (r.method, r.path, r.idempotent) for name, r in ROUTES.items()}
    # then: the same routes; names may differ where the schema's would read oddly
    assert sorted(table.values()) == sorted(served.values())



def test_a_credentials_token_is_kept_out_of_its_repr():
    # a credential printed or logged (print(client.create_credential())) shows no secret
    from switchboard_client.models import Credential

    credential = Credential.from_api({"id": "crd_1", "created_at": "2026-12-06T00:00:00Z", "token": "sbt_secret"})
    assert credential.token == "sbt_secret" and "sbt_secret" not in repr(credential)

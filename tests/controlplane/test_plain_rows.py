"""Rows read with plain SQL become the instances the ORM would load
(controlplane.db.model_columns, model_from_row): every field, converted as
the ORM converts it (booleans and aware datetimes on SQLite too). A query
compiled once (controlplane.db.Compiled) answers as the ORM does. Rows
sent as a derived table (rows_sql) read back as they were."""
import pytest
from django.conf import settings
from django.db import connection

from controlplane.db import Compiled, ids_in, model_columns, model_from_row, rows_sql
from controlplane.models import Member


def _plain(member_pk: int) -> Member:
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT {model_columns(Member, 'm')} FROM {Member._meta.db_table} m WHERE m.id = %s",
                       [member_pk])
        return model_from_row(Member, cursor.fetchone())


def test_a_plain_row_loads_the_instance_the_orm_loads(make_member):
    for member in (make_member("plainadmin", kind="human", is_admin=True, password="plain-pass-123"),
                   make_member("plainagent")):
        by_orm, by_sql = Member.objects.get(pk=member.pk), _plain(member.pk)
        for field in Member._meta.concrete_fields:
            orm_value, sql_value = getattr(by_orm, field.attname), getattr(by_sql, field.attname)
            assert (sql_value, type(sql_value)) == (orm_value, type(orm_value)), field.name
        assert by_sql.created_at.tzinfo is not None
        assert by_sql.is_admin is member.is_admin
        assert not by_sql._state.adding and by_sql._state.db == "default"


def test_a_plain_row_instance_saves_like_any_other(make_member):
    member = _plain(make_member("plainsave").pk)
    member.display_name = "Renamed"
    member.save(update_fields=["display_name"])
    assert Member.objects.get(pk=member.pk).display_name == "Renamed"


def _run(compiled: Compiled, *args) -> list:
    with connection.cursor() as cursor:
        cursor.execute(*compiled.sql(*args))
        return [value for value, in cursor.fetchall()]


def test_a_compiled_query_answers_as_the_orm_does_and_compiles_once_per_shape(make_member):
    # given: members, and a query with an IN list, a bound and a filter left out for None
    pks = [make_member(f"compiled{n}").pk for n in range(5)]
    builds = []

    def build(members, floor, ceiling):
        builds.append((len(members), ceiling is None))
        rows = Member.objects.filter(pk__in=members, pk__gte=floor)
        if ceiling is not None:
            rows = rows.filter(pk__lte=ceiling)
        return rows.order_by("pk").values_list("handle", flat=True)

    compiled = Compiled(build)
    cases = [(pks[:3], pks[1], None), (pks[2:5], pks[0], None), (pks[:3], pks[0], pks[1]), (pks[1:4], pks[2], pks[3]),
             (pks, pks[0], None), ([pks[4]], pks[4], pks[4]), (pks[:4], pks[0], None), (pks[:2], pks[0], None)]
    for members, floor, ceiling in cases:
        # when / then: the same rows as the ORM's own query of the same arguments
        expected = list(build(members, floor, ceiling))
        assert _run(compiled, members, floor, ceiling) == expected
    # and one compile per shape (list length padded to a power of two, ceiling or none): three members and
    # four share one; the ORM built each case once more above
    shapes = {({1: 1, 2: 2, 3: 4, 4: 4, 5: 8}[len(m)], c is None) for m, _, c in cases}
    assert len(shapes) == 5
    assert len(builds) == len(cases) + len(shapes)


def test_a_plain_id_list_is_one_statement_whatever_its_length_and_answers_the_same(make_member):
    pks = [make_member(f"inlist{n}").pk for n in range(5)]
    table = connection.ops.quote_name(Member._meta.db_table)
    texts = set()
    for members in (pks[:1], pks[:2], pks[:3], pks, pks * 20):
        which, params = ids_in("id", members)
        if connection.vendor == "postgresql":
            # one array: the same text for any length, and never past psycopg's 50 parameters it parses every time
            assert params == [members]
        else:  # a power of two of placeholders, the last value repeated
            assert len(params) in (1, 2, 4, 8, 128) and params[:len(members)] == members and set(params) == set(members)
        texts.add(which)
        with connection.cursor() as cursor:
            cursor.execute(f"SELECT id FROM {table} WHERE {which} ORDER BY id", params)
            assert [pk for pk, in cursor.fetchall()] == sorted(set(members))
    assert len(texts) == (1 if connection.vendor == "postgresql" else 5)


def test_a_compiled_querys_own_values_answer_as_the_orms_whatever_they_hold(make_member):
    # given: members whose names hold a LIKE wildcard and a quote, one an admin
    for n, name in enumerate(["50% off", "it's 50% off", "50 percent"]):
        make_member(f"compiledlit{n}", display_name=name, is_admin=n == 1)

    def build(floor):  # a choice, a pattern with an escaped wildcard, a quote: none of them arguments
        return (Member.objects.filter(pk__gte=floor, is_admin=False, status=Member.Status.ACTIVE)
                .exclude(display_name="it's").filter(display_name__contains="50%").values_list("handle", flat=True))

    compiled = Compiled(build)
    sql, params = compiled.sql(0)
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        answered = sorted(handle for handle, in cursor.fetchall())
    # then: the ORM's answer; on PostgreSQL only the argument is a parameter (the rest are literals a
    # generic plan can match against a partial index's condition)
    assert answered == sorted(build(0)) == ["compiledlit0"]
    if settings.IS_POSTGRES:
        assert params == [0]


def test_a_compiled_query_refuses_an_argument_it_does_not_pass_on(make_member):
    make_member("compiledref")
    # the argument is made into a handle, so no parameter carries it: the compiled SQL could not take it
    compiled = Compiled(lambda n: Member.objects.filter(handle=f"compiled{n}").values_list("pk", flat=True))
    with pytest.raises(ValueError, match="must become one of its parameters"):
        compiled.sql(2)


ROW_COLUMNS = {"id": "BIGINT", "n": "INTEGER", "label": "VARCHAR(40)", "gone": "SMALLINT"}


@pytest.mark.django_db
def test_a_derived_table_reads_back_its_rows_nulls_first_and_only_nulls_included():
    rows = [(1, None, "a", None), (2, 5, None, None), (3, None, None, None)]
    values, params = rows_sql(rows, ROW_COLUMNS)
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT id, n, label, gone FROM ({values}) v ORDER BY id", params)
        assert cursor.fetchall() == rows


@pytest.mark.skipif(not settings.IS_POSTGRES or not settings.DATABASES["default"]["OPTIONS"].get("server_side_binding"),
                    reason="PostgreSQL's arrays, with server-side binding (DB_PREPARE_THRESHOLD above 0)")
def test_a_derived_table_is_the_same_statement_whatever_its_number_of_rows():
    """So psycopg converts it once and PostgreSQL prepares it once."""
    statements = {rows_sql([(n, n, "x", None)] * n, ROW_COLUMNS)[0] for n in (1, 2, 50)}
    assert len(statements) == 1

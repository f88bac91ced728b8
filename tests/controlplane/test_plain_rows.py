"""Rows read with plain SQL become the instances the ORM would load
(controlplane.db.model_columns, model_from_row): every field, converted as
the ORM converts it (booleans and aware datetimes on SQLite too)."""
from django.db import connection

from controlplane.db import model_columns, model_from_row
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

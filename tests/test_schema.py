"""The database schema: the migrations describe the models, and the tables
every send and every delivery writes carry no index another one covers."""
import pytest
from django.core.management import call_command
from django.db import connection

# Written by every send (message, recipients, items, event, addressees,
# mailbox shares) or by every delivery (deliveries, attempts).
HOT_TABLES = ("inbox_message", "inbox_recipient", "inbox_inboxitem", "inbox_mailbox", "inbox_mailboxshare",
              "controlplane_event", "controlplane_eventaddressee", "webhooks_delivery", "webhooks_attempt")


@pytest.mark.django_db
def test_the_migrations_describe_the_models():
    # `--check` exits non-zero when a model change has no migration.
    call_command("makemigrations", "--check", "--dry-run", verbosity=0)


@pytest.mark.postgres  # PostgreSQL's catalogue; SQLite creates no foreign-key or LIKE indexes
@pytest.mark.django_db
def test_no_hot_table_pays_for_an_index_another_covers():
    # given: each index of the hot tables, with its columns in order
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT c.relname, i.relname, x.indisunique, x.indpred IS NOT NULL, pg_get_indexdef(x.indexrelid), "
            "ARRAY(SELECT a.attname FROM unnest(x.indkey) WITH ORDINALITY k(attnum, n) "
            "JOIN pg_attribute a ON a.attrelid = x.indrelid AND a.attnum = k.attnum ORDER BY k.n) "
            "FROM pg_index x JOIN pg_class c ON c.oid = x.indrelid JOIN pg_class i ON i.oid = x.indexrelid "
            "WHERE c.relname = ANY(%s)", [list(HOT_TABLES)])
        indexes = cursor.fetchall()
    assert {table for table, *_ in indexes} == set(HOT_TABLES)
    # when: a plain index whose columns lead another full index, or one for LIKE patterns
    covered = [(name, other) for table, name, unique, partial, _, columns in indexes if not unique and not partial
               for table2, other, _, partial2, _, columns2 in indexes
               if table2 == table and other != name and not partial2 and columns2[:len(columns)] == columns]
    patterns = [name for _, name, _, _, definition, _ in indexes if "pattern_ops" in definition]
    # then: every write would pay for them, and no read needs them
    assert covered == []
    assert patterns == []

from django.db import migrations

OLD = ("reap-deleted-mcp-subscriptions", "webhooks.tasks.reap_deleted_mcp_subscriptions")
NEW = ("reap-deleted-webhooks", "webhooks.tasks.reap_deleted")


def rename(old, new):
    """The hourly reaper's schedule, created by a worker's start
    (controlplane.schedules), is renamed rather than left behind calling a
    task that is gone."""
    def run(apps, schema_editor):
        apps.get_model("django_q", "Schedule").objects.filter(name=old[0]).update(name=new[0], func=new[1])
    return run


class Migration(migrations.Migration):

    dependencies = [
        ('webhooks', '0007_indexes_covered_by_composites'),
        ('django_q', '0019_alter_task_options_alter_ormq_key_alter_ormq_lock_and_more'),
    ]

    operations = [
        migrations.RunPython(rename(OLD, NEW), rename(NEW, OLD)),
    ]

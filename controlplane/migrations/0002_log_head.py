from django.db import migrations


def create_log_head(apps, schema_editor):
    apps.get_model("controlplane", "LogHead").objects.get_or_create(id=1)


class Migration(migrations.Migration):
    dependencies = [("controlplane", "0001_initial")]
    operations = [migrations.RunPython(create_log_head, migrations.RunPython.noop)]

"""The unmanaged lock model, for the admin entry and its permissions."""

from django.db import migrations, models


class Migration(migrations.Migration):
    """An unmanaged model: creates no table, only the admin entry and its permissions."""

    initial = True

    dependencies = []

    operations = [
        migrations.CreateModel(
            name="Lock",
            fields=[
                ("id", models.AutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
            ],
            options={
                "verbose_name": "lock",
                "verbose_name_plural": "locks",
                "permissions": [("release_lock", "Can force-release locks")],
                "managed": False,
                "default_permissions": ("view",),
            },
        ),
    ]

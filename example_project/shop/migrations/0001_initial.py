from django.db import migrations, models

import django_redlock.fencing


class Migration(migrations.Migration):
    initial = True

    dependencies = []

    operations = [
        migrations.CreateModel(
            name="Invoice",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
                ("number", models.CharField(max_length=20, unique=True)),
                ("status", models.CharField(default="open", max_length=20)),
                ("note", models.CharField(blank=True, max_length=200)),
                ("fencing_token", django_redlock.fencing.FencingTokenField()),
            ],
        ),
    ]

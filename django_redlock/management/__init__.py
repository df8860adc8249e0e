"""Django management commands of django_redlock."""

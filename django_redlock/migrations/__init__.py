"""The migrations of django_redlock's unmanaged admin model."""

"""The ``redlock`` management command (inspect and operate locks from a shell)."""

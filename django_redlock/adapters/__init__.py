"""The adapters over the hold (``manager.lock()``), by topic: lock keys (:mod:`.keys`), what a view
answers (:mod:`.answers`), views (:mod:`.views`) and the transactions they commit inside the lock
(:mod:`.transactions`), commands (:mod:`.commands`) and their stop guard (:mod:`.stop`). Import
their public names from :mod:`django_redlock.decorators`."""

"""The soak: real clients of every kind under random failures (see :mod:`.run`)."""

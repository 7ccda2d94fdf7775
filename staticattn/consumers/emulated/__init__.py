"""Consumers that run anywhere: the built-in gather consumer and its checksum columns, which
read every kind of metadata the way attention does."""

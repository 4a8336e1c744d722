"""e2e: drive SMG's real gateway and judge, from its own evidence, whether SHM happened."""

"""The transport core: a pure library (no click, no rich) that every command shares."""

"""doctor: every check in one run, each with the fix for its failure."""

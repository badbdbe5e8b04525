"""Data: the BSARD schema, fetching (sample | hub | local) and cleaning."""

"""SMG's gateway seen from outside: HTTP, its admin API and metrics, its start-up log and mode,
the gateways running on this host and the processes smgshm starts."""

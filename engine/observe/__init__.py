"""What the engine tells: metrics, the event log, the makespan meter, snapshots and their merge."""

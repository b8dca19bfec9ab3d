"""What the engine tells: metrics, the event log, the makespan meter, a job's progress, snapshots and their merge."""

"""What the engine tells: metrics, the event log, the makespan meter, a job's progress, spend, the results file, the loop's lag, snapshots and their merge."""

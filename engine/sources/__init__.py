"""Where work comes from: a workload file or a store's jobs, messages of several calls, a generated stream."""
